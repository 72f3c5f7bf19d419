"""The outbound address policy of channel deliveries (SSRF guard)."""

from __future__ import annotations

import pytest

from orchestrator.channels import EgressPolicy


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("127.9.9.9", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.100.100.200", False),  # Alibaba metadata (CGNAT range)
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("fd00:ec2::254", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:169.254.169.254", False),
        ("::ffff:8.8.8.8", True),
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("not-an-ip", False),
    ],
)
def test_default_policy(address: str, allowed: bool) -> None:
    assert EgressPolicy().allows(address) is allowed


def test_allowed_ranges_open_only_what_they_name() -> None:
    policy = EgressPolicy(["127.0.0.0/8", "10.20.0.0/16"])
    assert policy.allows("127.0.0.1") and policy.allows("10.20.3.4")
    assert not policy.allows("10.21.0.1") and not policy.allows("169.254.169.254")


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("http://127.0.0.1:8080/x", True),
        ("http://2130706433/", True),  # 127.0.0.1 as one decimal number
        ("http://0x7f.1/", True),  # hexadecimal and short form
        ("http://0177.0.0.1/", True),  # octal
        ("http://[::ffff:127.0.0.1]/", True),
        ("http://[::1]:9000/", True),
        ("http://169.254.169.254/latest/meta-data/", True),
        ("https://hooks.slack.com/services/T/B/x", False),  # a name: checked when connecting
        ("http://localhost/", False),  # likewise
        ("https://93.184.215.14/", False),
    ],
)
def test_literal_addresses_in_urls(url: str, refused: bool) -> None:
    assert EgressPolicy().literal_refused(url) is refused
