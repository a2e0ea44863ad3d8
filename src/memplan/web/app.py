"""The ASGI app of ``memplan serve``: one page, one fragment endpoint for live updates, the
one-file report and a JSON endpoint, all thin adapters over ``memplan.api``.

- ``GET /``: the page for the state in the URL (works without JavaScript too);
- ``GET|POST /result``: the results fragment htmx swaps in as a control changes; the
  ``HX-Replace-Url`` header keeps the recipe in the address bar;
- ``GET /max-micro-batch``: the largest micro-batch that fits, fetched by the page after
  the rest of the result (the search costs several estimates);
- ``GET /report``: the current recipe as the one-file HTML report;
- ``GET /api/estimate``: the estimate's JSON (``memplan estimate --format json``).

Bad input gets the CLI's message in the page with a 4xx status, never a traceback. Bodies,
uploads, query strings and numbers have limits. Nothing is fetched and no model code runs.
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..errors import ConfigError, MemplanError
from ..report.html import environment, render_report, result_view
from ..report.svg import category_bars
from .compute import Outcome, choices, evaluate, evaluate_all
from .fields import recipe_fields
from .state import MAX_CONFIG_BYTES, MAX_PINS, PageState, Multi, parse_state

__all__ = ["create_app", "MAX_BODY_BYTES", "MAX_QUERY_CHARS"]

log = logging.getLogger(__name__)
MAX_BODY_BYTES = MAX_CONFIG_BYTES + 64 * 1024
"""Largest request body: one config.json plus the form's fields."""
MAX_QUERY_CHARS = 24 * 1024
"""Longest query string (a recipe is ~300 characters; pins repeat it)."""
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'")


class _Env:
    env: Any = None


def _env() -> Any:
    if _Env.env is None:
        import jinja2

        env = environment()
        env.loader = jinja2.ChoiceLoader([jinja2.PackageLoader("memplan.web", "templates"),
                                          env.loader])
        _Env.env = env
    return _Env.env


def _headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", **(extra or {})}


def _compare(outcomes: list[Outcome]) -> dict[str, Any] | None:
    if len(outcomes) < 2:
        return None
    base = outcomes[0].state
    cols = []
    for k, o in enumerate(outcomes):
        diff = [f"{n}={v}" for n, v in o.state.recipe if base.overrides.get(n) != v]
        diff += [f"{n}={d}" for n, d in base.recipe if n not in o.state.overrides]
        for place in ("model", "gpu", "node"):
            if getattr(o.state, place) != getattr(base, place):
                diff.insert(0, f"{place}={getattr(o.state, place) or 'none'}")
        cols.append({"k": k, "name": "current" if k == 0 else f"pin {k}", "outcome": o,
                     "v": result_view(o.result) if o.result else None,
                     "diff": ", ".join(diff) if k else "the recipe above",
                     "query": o.state.query(with_pins=False)})
    series = [(c["name"], c["v"]["rank"]["categories"]) for c in cols if c["v"]]
    return {"cols": cols, "bars_svg": category_bars(series) if len(series) > 1 else ""}


def _results_context(state: PageState) -> dict[str, Any]:
    outcomes = evaluate_all(state)
    first = outcomes[0]
    return {"state": state, "outcome": first, "v": result_view(first.result) if first.result
            else None, "compare": _compare(outcomes), "max_pins": MAX_PINS}


async def _params(request: Request) -> tuple[Any, str]:
    """Query parameters, or the form of a POST (with its config.json text, pasted or
    uploaded); raises ``ConfigError`` on a body over the limits."""
    if len(request.url.query) > MAX_QUERY_CHARS:
        raise ConfigError([f"the address is {len(request.url.query)} characters long; the page "
                           f"accepts up to {MAX_QUERY_CHARS}. Remove some pinned recipes."])
    if request.method != "POST":
        return request.query_params, ""
    length = request.headers.get("content-length")
    if length is None or not length.isdigit() or int(length) > MAX_BODY_BYTES:
        raise ConfigError([f"the request body is {length or 'of unknown'} bytes; the page "
                           f"accepts up to {MAX_BODY_BYTES // 1024} KiB (a config.json up to "
                           f"{MAX_CONFIG_BYTES // 1024} KiB)."])
    try:
        async with request.form(max_files=1, max_fields=200,
                                max_part_size=MAX_BODY_BYTES) as form:
            fields = {k: [v for v in form.getlist(k) if isinstance(v, str)] for k in form}
            upload = form.get("config_file")
            raw = b""
            if upload is not None and not isinstance(upload, str) and upload.filename:
                raw = await upload.read(MAX_CONFIG_BYTES + 1)
                name = upload.filename
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - multipart errors are bad input
        raise ConfigError([f"the form could not be read: {e}."]) from None
    text = (fields.get("config_json") or [""])[-1]
    if raw:
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError([f"{name} is over {MAX_CONFIG_BYTES // 1024} KiB; the page "
                               f"accepts up to {MAX_CONFIG_BYTES // 1024} KiB."])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError([f"{name} is not UTF-8 text; expected a config.json."]) from None
    return Multi(fields), text


def _apply_actions(params: Any, state: PageState) -> PageState:
    """The pin/unpin buttons: add the current recipe to the comparison, or drop one."""
    from dataclasses import replace

    actions = params.getlist("action")
    action = actions[-1] if actions else None
    if action == "pin":
        q = state.query(with_pins=False)
        if q not in state.pins and len(state.pins) < MAX_PINS:
            return replace(state, pins=state.pins + (q,))
    elif isinstance(action, str) and action.startswith("unpin:") and action[6:].isdigit():
        k = int(action[6:])
        return replace(state, pins=tuple(p for i, p in enumerate(state.pins) if i != k))
    return state


async def _state(request: Request) -> PageState:
    params, config = await _params(request)
    state = parse_state(params, config_json=config)
    return _apply_actions(params, state)


def _error_page(message: str, status: int, fragment: bool) -> HTMLResponse:
    name = "_error.html" if fragment else "page.html"
    ctx: dict[str, Any] = {"message": message}
    if not fragment:
        ctx.update(_page_context(PageState()), error=message, results=None)
    return HTMLResponse(_env().get_template(name).render(**ctx), status_code=status,
                        headers=_headers())


def _page_context(state: PageState) -> dict[str, Any]:
    specs = recipe_fields()
    groups: dict[str, list[Any]] = {}
    for s in specs:
        groups.setdefault(s.group, []).append(s)
    return {"state": state, "groups": groups, "choices": choices(), "error": None}


async def page(request: Request) -> Response:
    try:
        state = await _state(request)
    except MemplanError as e:
        return _error_page(str(e), 422, fragment=False)
    ctx = _page_context(state)
    ctx["results"] = await run_in_threadpool(_results_context, state)
    status = 200 if ctx["results"]["outcome"].result else 422
    return HTMLResponse(_env().get_template("page.html").render(**ctx), status_code=status,
                        headers=_headers())


async def result(request: Request) -> Response:
    try:
        state = await _state(request)
    except MemplanError as e:
        return _error_page(str(e), 413 if "accepts up to" in str(e) and "bytes" in str(e)
                           else 422, fragment=True)
    ctx = await run_in_threadpool(_results_context, state)
    ok = ctx["outcome"].result is not None
    extra = {"HX-Replace-Url": "/?" + state.query()} if ok and not state.config_json else {}
    return HTMLResponse(_env().get_template("_results.html").render(**ctx),
                        status_code=200 if ok else 422, headers=_headers(extra))


async def report(request: Request) -> Response:
    try:
        state = await _state(request)
    except MemplanError as e:
        return _error_page(str(e), 422, fragment=False)
    outcome = await run_in_threadpool(evaluate, state)
    if outcome.result is None:
        return _error_page(outcome.error, 422, fragment=False)
    return HTMLResponse(render_report(outcome.result), headers=_headers())


async def api_estimate(request: Request) -> Response:
    try:
        state = await _state(request)
    except MemplanError as e:
        return JSONResponse({"error": str(e)}, status_code=422)
    outcome = await run_in_threadpool(evaluate, state)
    if outcome.result is None:
        return JSONResponse({"error": outcome.error}, status_code=422)
    return JSONResponse(outcome.result)


async def max_micro_batch(request: Request) -> Response:
    """The largest micro-batch that fits, as the KPI element the page swaps in."""
    try:
        state = await _state(request)
    except MemplanError as e:
        return _error_page(str(e), 422, fragment=True)
    outcome = await run_in_threadpool(evaluate, state)
    mmb = outcome.result["gpu"]["max_micro_batch"] if outcome.result else None
    text = "?" if mmb is None else str(mmb) if mmb else "none fits"
    return HTMLResponse(f'<b data-k="max_micro_batch">{text}</b>',
                        status_code=200 if outcome.result else 422, headers=_headers())


async def htmx_js(request: Request) -> Response:
    js = resources.files("memplan.web").joinpath("static/htmx.min.js").read_bytes()
    return Response(js, media_type="text/javascript",
                    headers=_headers({"Cache-Control": "max-age=86400"}))


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("memplan serve: internal error on %s", request.url.path)
    return HTMLResponse("<!doctype html><p>memplan hit an internal error (a bug: please report "
                        "it with the address of this page). The server log has the details.</p>",
                        status_code=500, headers=_headers())


class _ServerTiming:
    """ASGI middleware: ``Server-Timing: app;dur=<ms>`` on every response (the time from the
    request to the response headers: parsing, estimate and rendering; what the load check and
    the benchmark report)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def timed(message: Any) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - t0) * 1000
                message = {**message, "headers": [*message.get("headers", []), (
                    b"server-timing", f"app;dur={ms:.2f}".encode())]}
            await send(message)

        await self.app(scope, receive, timed)


def create_app() -> Starlette:
    """The ASGI application (Starlette)."""
    return Starlette(middleware=[Middleware(_ServerTiming)], routes=[
        Route("/", page), Route("/result", result, methods=["GET", "POST"]),
        Route("/report", report), Route("/api/estimate", api_estimate),
        Route("/max-micro-batch", max_micro_batch),
        Route("/static/htmx.min.js", htmx_js)],
        exception_handlers={Exception: _server_error})
