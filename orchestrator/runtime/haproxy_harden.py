"""Hardening of the HAProxy configuration Ray Serve renders, applied by a wrapper that Serve
runs instead of the haproxy binary (`RAY_SERVE_HAPROXY_BINARY_PATH`).

Serve's template (ray/serve/_private/haproxy_templates.py) has no setting for what we need:
- it passes the client's own `X-Forwarded-For` through, and the replica's uvicorn trusts that
  header from 127.0.0.1 (where HAProxy connects from), so a client could name any address;
- no `timeout http-request`, `timeout client 3600s` and `maxconn 4096`: a few thousand
  sockets that never finish their headers hold every slot (slowloris);
- the stats page and the Prometheus exporter bind every interface, the admin socket is 0666;
- a client's X-Request-ID goes to Serve as the request's id (echoed, logged as is).

Serve starts HAProxy as `<binary> -db -f <config> [-sf pids] [-x socket]` on every start and
reload, so the wrapper rewrites `<config>` into `<config>.hardened` and execs the real binary
on that. Run as a script (stdlib only, no package imports: it runs on every reload):
`python -S haproxy_harden.py <policy.json> <args Serve passes>`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProxyPolicy:
    binary: str  # the real haproxy
    host: str  # where the service listens: stats and exporter bind here too
    header_timeout_s: int = 10
    client_timeout_s: int = 120
    max_conns_per_source: int = 256
    # Our own proxies in front of HAProxy: their X-Forwarded-For is extended, not replaced.
    trusted_proxies: list[str] = field(default_factory=list)
    # Sent with every request (X-Orch-Ingress); the replicas refuse requests without it.
    ingress_key: str = ""
    # HAProxy's log line per request (see `quiet`).
    request_log: bool = False
    # A client connection keeps its replica while the backend is otherwise idle
    # (`_CONNECTION_AFFINITY`; the setting `proxy_connection_affinity`).
    connection_affinity: bool = True


# The one form of a request id (deployments/edge.py REQUEST_ID, the same text).
REQUEST_ID_PATTERN = r"[A-Za-z0-9._:-]{1,128}"

# HAProxy is the first hop: the request's id is always made here (Serve keeps a well-formed
# X-Request-ID it is given, so the replica's edge and the app take this one); the client's
# own, if well-formed, travels apart as X-Client-Request-ID, one they sent themselves is
# dropped. Anything else a client wrote there (spaces, markup, bytes outside ASCII) is gone.
REQUEST_ID_RULES = [
    "    http-request del-header x-client-request-id",
    "    http-request set-header x-client-request-id %[req.fhdr(x-request-id)] "
    f"if {{ req.fhdr(x-request-id) -m reg ^{REQUEST_ID_PATTERN}$ }}",
    "    http-request set-header x-request-id %[uuid]",
]


def _bind_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# Serve's per-request log lines: the access log to syslog (`log global` + `option httplog`)
# and the line for Serve's request metrics on a Unix socket (`log <sock> ... rfc5424`).
_REQUEST_LOG = re.compile(
    r"(?m)^[ \t]+(log global|log /\S+ .*|log-format-sd .*"
    r"|option httplog|option log-health-checks)\n"
)


def quiet(config: str) -> str:
    """`config` without a log line per request. Each request cost HAProxy a formatted line
    on two sockets and Serve's HAProxy manager (a Python actor) the parsing of one: measured
    ~60 us of a gateway call at concurrency 1 and 12% of the throughput at 32. The replicas
    log every request (the access log) and count it (svc_http_requests_total) anyway. The
    global `log` target stays: HAProxy's own alerts."""
    config = _REQUEST_LOG.sub("", config)
    config, count = re.subn(r"(?m)^(defaults\n)", "\\g<1>    no log\n", config, count=1)
    if count != 1:
        raise ValueError("HAProxy config: no defaults section")
    return config


def harden(config: str, policy: ProxyPolicy) -> str:
    """The rendered configuration with our rules in; each rewrite is checked to have applied,
    so a change of Serve's template fails loudly instead of leaving a hole."""
    host = _bind_host(policy.host)
    rewrites = [
        # Admin socket: the service's own user only.
        (r"(stats socket \S+ mode )666\b", r"\g<1>600"),
        # The exporter and the stats page: where the service listens, not every interface.
        (r"(frontend prometheus\n\s+bind )\*?:(\d+)", rf"\g<1>{host}:\g<2>"),
        (r"(listen stats\n\s+bind )\*?:(\d+)", rf"\g<1>{host}:\g<2>"),
        # Header deadline and a bounded idle time for clients (SSE streams ping well within).
        (
            r"(?m)^(defaults\n)",
            rf"\g<1>    timeout http-request {policy.header_timeout_s}s\n",
        ),
        (r"(?m)^([ \t]+timeout client )\d+s$", rf"\g<1>{policy.client_timeout_s}s"),
    ]
    for pattern, replacement in rewrites:
        config, count = re.subn(pattern, replacement, config, count=1)
        if count != 1:
            raise ValueError(f"HAProxy config: no match for {pattern!r}")

    rules = [
        "    # Added by the orchestrator (orchestrator/runtime/haproxy_harden.py).",
        "    stick-table type ipv6 size 200k expire 60s store conn_cur",
        "    tcp-request connection track-sc0 src",
        f"    tcp-request connection reject if {{ sc0_conn_cur gt {policy.max_conns_per_source} }}",
        *REQUEST_ID_RULES,  # before any rule of Serve's template that reads the id
        "    http-request del-header forwarded",
    ]
    if policy.ingress_key:
        rules.append(f"    http-request set-header X-Orch-Ingress {policy.ingress_key}")
    if policy.trusted_proxies:
        trusted = " ".join(policy.trusted_proxies)
        rules += [
            f"    acl from_trusted_proxy src {trusted}",
            "    acl has_xff req.fhdr(x-forwarded-for) -m found",
            # fhdr: the whole (last) header line, commas and all, not just its last element.
            "    http-request set-header X-Forwarded-For "
            '"%[req.fhdr(x-forwarded-for)], %[src]" if from_trusted_proxy has_xff',
            "    http-request set-header X-Forwarded-For %[src] if !from_trusted_proxy or !has_xff",
            "    http-request del-header x-forwarded-proto if !from_trusted_proxy",
        ]
    else:
        # What the client wrote is dropped: the replica sees the TCP peer HAProxy saw (and
        # the scheme it used: uvicorn would take X-Forwarded-Proto from HAProxy too).
        rules.append("    http-request set-header X-Forwarded-For %[src]")
        rules.append("    http-request del-header x-forwarded-proto")
    frontend = re.compile(r"(?m)^(frontend http_frontend\n\s+bind [^\n]+\n)")
    config, count = frontend.subn(lambda m: m.group(1) + "\n".join(rules) + "\n", config, 1)
    if count != 1:
        raise ValueError("HAProxy config: no http_frontend section")
    # None yet in the configuration HAProxy starts with, before an application is deployed.
    if policy.connection_affinity:
        config, apps = _APP_BACKEND.subn(lambda m: m.group(1) + _CONNECTION_AFFINITY, config)
        # Serve's fallback proxy is a `backup` server of the app's backend: never a
        # connection's replica (HAProxy would keep an idle connection on it once it served).
        config = _BACKUP_SERVER.sub(r"\g<1> non-stick", config)
        if apps:
            config = config.rstrip("\n") + "\n" + _IN_FLIGHT_TABLE
    return config if policy.request_log else quiet(config)


# Serve's backend of each application (`backend http-<app>`; its `default_backend` has no
# servers). With this rule a request goes to the replica its connection's last request went
# to when no other request is in flight (the in-flight table's trackers count this one);
# otherwise leastconn picks, and the affinity table remembers that replica. Event streams
# (`/sync-events`; `/events` asked for as text/event-stream) are neither counted nor kept
# (a streamed completion is: it asks for text/event-stream too, and ends): an open one
# would otherwise turn the affinity off for every client; leastconn spreads them. Balanced
# per request, a sequential client alternated between two idle replicas, and each call found
# its replica idle since the call before: +0.7-1.4 ms a call at c=1 on the 2-core machine.
# Pinned for good (the rule before), clients of unequal load skewed the replicas up to 2.9x.
# This rule: 1.01-1.03x, as balanced per request (1.00-1.02x) (scripts/bench.py
# haproxy-balance and gateway, docs/design-notes.md "HAProxy connection affinity").
# Entries outlive the 90 s keep-alive.
_APP_BACKEND = re.compile(r"(?m)^(backend http-\S+\n)")
_CONNECTION_AFFINITY = (
    "    # Added by the orchestrator: a client connection keeps its replica while nothing\n"
    "    # else is in flight; under load, leastconn decides (haproxy_harden.py).\n"
    "    stick-table type string len 64 size 200k expire 2m\n"
    "    http-request set-var(txn.orch_event_stream) bool(1) if { path_end /sync-events }\n"
    "    http-request set-var(txn.orch_event_stream) bool(1)"
    " if { path_end /events } { req.hdr(accept) -m sub text/event-stream }\n"
    "    acl orch_event_stream var(txn.orch_event_stream) -m bool\n"
    "    http-request track-sc1 int(0) table orch_in_flight if !orch_event_stream\n"
    "    http-request set-var(txn.orch_client_port) src_port\n"
    "    stick match src,concat(:,txn.orch_client_port)"
    " if !orch_event_stream { sc1_trackers(orch_in_flight) le 1 }\n"
    "    stick store-request src,concat(:,txn.orch_client_port) if !orch_event_stream\n"
)
# The requests in flight in the app backends, event streams aside: one entry, whose trackers
# are the requests tracking it (each until its response ends).
_IN_FLIGHT_TABLE = "backend orch_in_flight\n    stick-table type integer size 1 expire 10m\n"
_BACKUP_SERVER = re.compile(r"(?m)^(    server \S+ \S+(?: [^\n]*)? backup)$")

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: this process (and what it execs) gets SIGTERM when its parent ends. Serve's
    HAProxy manager (a Ray actor) starts HAProxy and stops it; when the actor dies without
    stopping it (its cluster killed at once, a SIGKILL), an orphaned HAProxy kept the
    service's port and the next start failed with "address in use"."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request took effect
        sys.exit(1)


def _exec(policy_path: str, args: list[str]) -> None:
    die_with_parent()
    with open(policy_path) as f:
        policy = ProxyPolicy(**json.load(f))
    out = list(args)
    if "-f" not in out:  # `-v` and the like
        os.execv(policy.binary, [policy.binary, *out])
    index = out.index("-f") + 1
    source = out[index]
    with open(source) as f:
        hardened = harden(f.read(), policy)
    target = f"{source}.hardened"
    tmp = f"{target}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(hardened)
    os.replace(tmp, target)
    out[index] = target
    os.execv(policy.binary, [policy.binary, *out])


if __name__ == "__main__":
    _exec(sys.argv[1], sys.argv[2:])
