"""`AsyncClient`, written by hand. orchestrator/sdk/_sync, `Client`, is generated from these
modules by scripts/unasync_sdk.py (unasync: `async def` -> `def`, `await` dropped, the names
its table maps); tests/unit/test_sdk_generated.py fails when the two differ."""
