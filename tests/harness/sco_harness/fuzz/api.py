"""The distributor's HTTP API, from its own OpenAPI schema, with schemathesis.

Cases are schemathesis' requests for each operation of `/openapi.json`: ones the
schema allows and ones it does not (negative: wrong types, values out of range,
missing or extra fields), each sent without a token, with a token that is not
one, or with a node's real token. Each goes through the app in process (ASGI).

The rules: never a 5xx (an unclear error: the node cannot tell what it did
wrong); and every answer as the schema promises it (schemathesis' checks:
status codes the schema names, bodies and headers of their documented shapes),
a breach counting as a crash.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.contracts import token_digest
from sco.domain.instances import created
from sco.domain.lifecycle import State
from sco_harness.builders import instance, spot_pool
from sco_harness.fuzz import AppHooks, Check, Judge, Target

POOL = spot_pool(zone="a")
TOKEN = secrets.token_urlsafe(32)
AUTH = ("none", "wrong", "real")


def _requests(schema: Any) -> st.SearchStrategy[Any]:
    from schemathesis import GenerationMode

    strategies = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies.append(operation.as_strategy(generation_mode=mode))
    return st.tuples(st.one_of(strategies), st.sampled_from(AUTH))


def api_target(hooks: AppHooks) -> Target:
    """The cases need the schema, which needs the app: both are built here, once, over
    a store of its own that the world then serves."""
    import atexit
    import shutil
    import tempfile

    import schemathesis

    folder = Path(tempfile.mkdtemp(prefix="sco-fuzz-api-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    store = SqlFleetStore(sqlite_url(folder / "state.sqlite"))
    store.upsert_pools([POOL])
    node = instance(POOL, State.READY)
    store.record([created(node, "seeded")])
    store.contracts.set_token(node.id, token_digest(TOKEN), time.time() + 86400, time.time())
    app = hooks.distributor_app(store.contracts)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)

    @contextmanager
    def world(_folder: Path) -> Iterator[Check]:
        # The app's own warnings of refused requests: thousands, as designed.
        logging.getLogger("sco.apps.distributor").setLevel(logging.ERROR)

        def check(case: tuple[Any, str], judge: Judge) -> None:
            request, auth = case
            headers = dict(request.headers or {})
            if auth == "real":
                headers["Authorization"] = f"Bearer {TOKEN}"
            elif auth == "wrong":
                headers["Authorization"] = f"Bearer {secrets.token_urlsafe(16)}"
            if isinstance(request.query, dict) and "wait" in request.query:
                request.query["wait"] = _short(request.query["wait"])
            # In process: schemathesis runs the app's lifespan once, on a loop of its own.
            response = judge.must(lambda: request.call(headers=headers))
            if response is None:
                return
            if response.status_code >= 500:
                judge.unclear(
                    f"{request.method} {request.path}: HTTP {response.status_code}: "
                    f"{response.text[:200]}"
                )
                return
            breaches = _breaches(lambda: request.validate_response(response))
            for breach in breaches:
                judge.crash(
                    f"{request.method} {request.path}: HTTP {response.status_code}: {breach}",
                    "apps/distributor.py",
                )
            if breaches:
                return
            if response.status_code < 400:
                judge.accepted += 1
            else:
                judge.rejected += 1

        try:
            yield check
        finally:
            store.close()

    return Target("distributor_api", _requests(schema), world, weight=1.0)


def _breaches(validate: Callable[[], object]) -> list[str]:
    """What schemathesis' checks found wrong with an answer, each as `code title: message`."""
    from schemathesis.core.failures import Failure, FailureGroup

    try:
        validate()
    except FailureGroup as group:
        found = list(group.exceptions)
    except Failure as one:
        found = [one]
    else:
        return []
    return [f"{f.code} {f.title}: {' '.join(str(f.message).split())[:200]}" for f in found]


def _short(wait: object) -> object:
    """A long poll's wait, cut to a tenth of a second (the fuzzing must not wait 300 s
    for a contract that does not change); a wait that is not a number stays as it is."""
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0.1:
        return 0.1
    return wait
