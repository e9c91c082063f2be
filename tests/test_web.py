"""The dashboard (memable.web) through its WSGI interface, on every store: what each page
shows, each action and what it changes, access (read-only, token, CSRF), bad input,
and escaping of every stored field. The real-browser tests are test_web_browser.py."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from click.testing import CliRunner
from werkzeug.test import Client, TestResponse

from memable import Context, Engine
from memable._cli.commands import main
from memable._errors import StepNotFound
from memable.web import Dashboard, app

TIMEOUT = 10
SCRIPT = '<script>alert("memable")</script>'


def _csrf(page: TestResponse) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def _post(client: Client, path: str, page: TestResponse, **form: str) -> TestResponse:
    """POST ``form`` to ``path`` with the CSRF token ``page`` carries."""
    return client.post(path, data={"csrf": _csrf(page), **form})


def _detail(workflow: str, instance_id: str) -> str:
    return "/instance?" + urlencode({"workflow": workflow, "id": instance_id})


def _status(engine: Engine, workflow: str, instance_id: str) -> str:
    meta = engine.get_metadata(workflow, instance_id)
    assert meta is not None
    return type(meta.status).__name__


#: The steps each instance executed (not replayed), by instance id; cleared per test.
CALLS: dict[str, list[str]] = {}


def _order(ctx: Context, order: dict[str, Any]) -> str:
    """Charge, wait for approval, ship: three steps, the middle a signal (the steps that
    execute are noted in CALLS)."""
    ran = CALLS.setdefault(ctx.instance_id, [])
    ctx.step("charge").run(lambda: ran.append("charge") or order["amount"])
    ctx.set_status("waiting for approval")
    approved = ctx.suspend("approve")
    ctx.step("ship").run(lambda: ran.append("ship") or f"shipped {order['item']}")
    return f"{order['item']}: {approved}"


def _flaky(ctx: Context, n: int) -> int:
    ctx.step("one").run(lambda: n)
    return ctx.step("two").run(lambda: 1 // 0 if n >= 0 else n)


def _broken(ctx: Context) -> str:
    calls = CALLS.setdefault(ctx.instance_id, [])
    ctx.step("first").run(lambda: calls.append("first"))
    calls.append("second")
    return ctx.step("second").run(lambda: "ok" if len(calls) > 2 else str(1 // 0))


def _parent(ctx: Context) -> list[int]:
    return ctx.children("kids", "plain", [1, 2])


def _fail_with_script(ctx: Context) -> None:
    def fail() -> None:
        raise RuntimeError(SCRIPT)

    ctx.step("k").run(fail)


@pytest.fixture
def running(make_engine: Callable[..., Engine]) -> Iterator[Engine]:
    """A started engine on the parametrised store with every workflow of these tests."""
    CALLS.clear()
    engine = make_engine(poll_interval=0.05)
    engine.register("order", _order)
    engine.register("flaky", _flaky)
    engine.register("plain", lambda ctx, x: x)
    engine.register("broken", _broken)
    engine.register("parent", _parent)
    engine.register("out", lambda ctx: SCRIPT)
    engine.register("status", lambda ctx: ctx.set_status(SCRIPT))
    engine.register("keyed", lambda ctx: ctx.step(SCRIPT).run(lambda: 1))
    engine.register("result", lambda ctx: ctx.step("k").run(lambda: SCRIPT))
    engine.register("error", _fail_with_script)
    engine.register(SCRIPT, lambda ctx: None)
    with engine:
        yield engine


def _client(engine: Engine, **options: Any) -> Client:
    return Client(app(engine, **options))


def _suspended(engine: Engine, instance_id: str) -> None:
    """An order waiting for its approval signal."""
    state = engine.invoke("order", {"amount": 5, "item": "book"},
                          instance_id=instance_id).wait(TIMEOUT)
    assert type(state).__name__ == "Suspended"


def _rows(page: TestResponse, table: str) -> list[list[str]]:
    """The text of each cell of each body row of the table with id ``table``."""
    body = page.text.split(f'id="{table}"')[1].split("</table>")[0]
    return [[re.sub(r"<[^>]+>", "", cell).strip()
             for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def _failed(engine: Engine, *ids: str) -> None:
    for instance_id in ids:
        assert engine.invoke("flaky", 1, instance_id=instance_id).wait(TIMEOUT) is not None
        assert _status(engine, "flaky", instance_id) == "Failed"


# ---------------------------------------------------------------------- pages


def test_the_overview_counts_each_workflow_by_status(running: Engine) -> None:
    """The overview page counts each workflow's instances by status with a total row, and each
    count links to the list filtered by that workflow and status."""
    _failed(running, "f-1", "f-2")
    running.invoke("plain", 1, instance_id="p-1").result(TIMEOUT)
    page = _client(running).get("/")
    assert page.status_code == 200
    rows = _rows(page, "counts")
    assert rows[0][1:] == ["queued", "running", "suspended", "completed", "failed",
                           "cancelled", "all"]
    assert ["flaky", "0", "0", "0", "0", "2", "0", "2"] in rows
    assert ["plain", "0", "0", "0", "1", "0", "0", "1"] in rows
    assert rows[-1] == ["all", "0", "0", "0", "1", "2", "0", "3"]
    assert "instances?workflow=flaky&amp;status=failed" in page.text


def test_the_list_is_newest_first_paged_by_50_with_the_page_in_the_url(
    running: Engine,
) -> None:
    """The instance list shows 50 instances a page, newest first; the next page's link keeps the
    filter and puts the page number in the URL, and the last page has a previous link and no
    next."""
    for i in range(60):
        running.invoke("plain", i, instance_id=f"p-{i:02d}").result(TIMEOUT)
    client = _client(running)
    first = client.get("/instances?workflow=plain")
    ids = re.findall(r'class="instance-link"[^>]*>([^<]+)<', first.text)
    assert ids == [f"p-{i:02d}" for i in range(59, 9, -1)]
    nxt = re.search(r'id="page-next" href="([^"]+)"', first.text)
    assert nxt is not None
    assert parse_qs(urlparse(nxt.group(1).replace("&amp;", "&")).query) == {
        "workflow": ["plain"], "page": ["2"]}
    second = client.get(nxt.group(1).replace("&amp;", "&"))
    assert re.findall(r'class="instance-link"[^>]*>([^<]+)<', second.text) == [
        f"p-{i:02d}" for i in range(9, -1, -1)]
    assert 'id="page-next"' not in second.text
    assert 'id="page-prev"' in second.text


def test_the_list_filters_by_workflow_status_and_id_prefix(running: Engine) -> None:
    """The list filters by workflow, by status and by an instance id prefix, alone or together;
    the prefix is case-sensitive on every store."""
    _failed(running, "a-1", "b-1")
    running.invoke("plain", 1, instance_id="a-2").result(TIMEOUT)
    client = _client(running)

    def listed(query: str) -> set[str]:
        return set(re.findall(r'class="instance-link"[^>]*>([^<]+)<',
                              client.get(f"/instances?{query}").text))

    assert listed("status=failed") == {"a-1", "b-1"}
    assert listed("id=a-") == {"a-1", "a-2"}
    assert listed("workflow=flaky&id=a") == {"a-1"}
    assert listed("workflow=plain&status=failed") == set()
    assert listed("id=A-") == set()  # the prefix is case-sensitive on every store


def test_the_detail_page_shows_steps_in_order_the_error_and_its_traceback(
    running: Engine,
) -> None:
    """The page of a failed instance lists its steps in order with the error and shows the
    traceback; an instance that has ended is not polled for updates."""
    _failed(running, "f-1")
    page = _client(running).get(_detail("flaky", "f-1"))
    assert page.status_code == 200
    steps = page.text.split('id="steps"')[1].split("</table>")[0]
    assert re.findall(r'class="key">([^<]+)<', steps) == ["one", "two"]
    assert "ZeroDivisionError" in steps
    assert 'id="traceback"' in page.text
    assert "Traceback (most recent call last)" in page.text
    assert 'data-terminal="true"' in page.text
    assert "live.js" not in page.text  # an instance that ended is not polled


def test_a_suspended_instance_is_live_and_names_what_it_awaits(running: Engine) -> None:
    """The page of a suspended instance names the signal it awaits and its status message and
    refreshes itself (live.js and a meta refresh); its live fragment is no full page
    and says terminal once a signal has completed the run."""
    _suspended(running, "o-1")
    client = _client(running)
    page = client.get(_detail("order", "o-1"))
    assert 'data-terminal="false"' in page.text
    assert "live.js" in page.text
    assert '<meta http-equiv="refresh"' in page.text
    assert '<ul id="awaiting"><li>approve</li></ul>' in page.text
    assert "waiting for approval" in page.text
    fragment = client.get("/instance/live?workflow=order&id=o-1")
    assert fragment.status_code == 200
    assert "<html" not in fragment.text
    assert 'data-terminal="false"' in fragment.text
    running.signal("order", "o-1", "approve", "yes").result(TIMEOUT)
    assert 'data-terminal="true"' in client.get("/instance/live?workflow=order&id=o-1").text


def test_parent_and_children_link_to_each_other(running: Engine) -> None:
    """A parent's page links to each of its children, and a child's page links back to its
    parent."""
    running.invoke("parent", instance_id="p").result(TIMEOUT)
    client = _client(running)
    page = client.get(_detail("parent", "p"))
    children = page.text.split('id="children"')[1].split("</ul>")[0]
    links = re.findall(r'href="([^"]+)"', children)
    assert len(links) == 2
    child = client.get(links[0].replace("&amp;", "&"))
    assert child.status_code == 200
    assert 'id="parent" href="/instance?workflow=parent&amp;id=p"' in child.text


def test_metrics_are_the_prometheus_text_format(running: Engine) -> None:
    """/metrics answers in the Prometheus text format, counting instances by workflow and
    status."""
    _failed(running, "f-1")
    page = _client(running).get("/metrics")
    assert page.status_code == 200
    assert page.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'memable_instances{workflow="flaky",status="failed"} 1' in page.text.splitlines()


# ---------------------------------------------------------------------- actions


def test_signal_delivers_a_json_payload_and_the_run_goes_on(running: Engine) -> None:
    """With actions allowed, the signal form delivers its JSON payload, redirects back to the
    instance's page, and the run completes with that value."""
    _suspended(running, "o-1")
    client = _client(running, allow_actions=True)
    page = client.get(_detail("order", "o-1"))
    done = _post(client, "/instance/signal", page, workflow="order", id="o-1",
                 key="approve", payload='{"by": "ada"}')
    assert done.status_code == 303
    assert done.headers["Location"] == _detail("order", "o-1") + "&done=signal"
    assert running.invocation("order", "o-1").result(TIMEOUT) == "book: {'by': 'ada'}"


def test_cancel_ends_the_instance(running: Engine) -> None:
    """The cancel form ends a suspended instance; posting it again answers 409, saying the
    instance is cancelled."""
    _suspended(running, "o-1")
    client = _client(running, allow_actions=True)
    page = client.get(_detail("order", "o-1"))
    assert _post(client, "/instance/cancel", page, workflow="order", id="o-1"
                 ).status_code == 303
    assert _status(running, "order", "o-1") == "Cancelled"
    again = _post(client, "/instance/cancel", page, workflow="order", id="o-1")
    assert again.status_code == 409
    assert "cancelled" in again.text


def test_resume_runs_a_failed_instance_again(running: Engine) -> None:
    """A failed instance's page offers resume; resuming reruns it from the failed step, the
    completed first step not running again."""
    running.invoke("broken", instance_id="b-1").wait(TIMEOUT)
    client = _client(running, allow_actions=True)
    page = client.get(_detail("broken", "b-1"))
    assert 'id="resume"' in page.text
    assert _post(client, "/instance/resume", page, workflow="broken", id="b-1"
                 ).status_code == 303
    assert running.invocation("broken", "b-1").result(TIMEOUT) == "ok"
    assert CALLS["b-1"] == ["first", "second", "second"]  # the first step ran once


def test_fork_copies_the_steps_before_the_key_and_reruns_from_it(running: Engine) -> None:
    """The fork form makes a new instance that copies the steps before the chosen key (and the
    signal's value) and runs from that key; the source is untouched, and posting the same form
    again is 409, forking nothing."""
    _suspended(running, "o-1")
    running.signal("order", "o-1", "approve", "yes").result(TIMEOUT)
    client = _client(running, allow_actions=True)
    page = client.get(_detail("order", "o-1"))
    done = _post(client, "/instance/fork", page, workflow="order", id="o-1",
                 from_key="ship", new_id="o-1.again")
    assert done.status_code == 303
    assert done.headers["Location"] == _detail("order", "o-1.again") + "&done=fork"
    assert running.invocation("order", "o-1.again").result(TIMEOUT) == "book: yes"
    steps = {s.key: s for s in running.steps("order", "o-1.again")}
    source = {s.key: s for s in running.steps("order", "o-1")}
    assert steps["charge"] == source["charge"]  # copied, not run again
    assert CALLS["o-1"] == ["charge", "ship"]
    assert CALLS["o-1.again"] == ["ship"]
    assert steps["approve"].result == "yes"
    # The source is untouched; a second POST of the same form makes nothing new.
    again = _post(client, "/instance/fork", page, workflow="order", id="o-1",
                  from_key="ship", new_id="o-1.again")
    assert again.status_code == 409
    assert "nothing was forked" in again.text
    assert len(running.list_instances("order")) == 2


def test_fork_from_a_key_it_never_reached_names_the_keys_it_has(running: Engine) -> None:
    """A fork from a key the instance never reached is refused with 400, listing the keys it
    has, and makes no instance."""
    running.invoke("plain", 1, instance_id="p-1").result(TIMEOUT)
    _failed(running, "f-1")
    client = _client(running, allow_actions=True)
    page = client.get(_detail("flaky", "f-1"))
    refused = _post(client, "/instance/fork", page, workflow="flaky", id="f-1",
                    from_key="three", new_id="f-2")
    assert refused.status_code == 400
    assert "its keys: &#39;one&#39;, &#39;two&#39;" in refused.text
    assert running.get_metadata("flaky", "f-2") is None


def test_bulk_resume_states_the_filter_and_count_and_acts_on_exactly_that(
    running: Engine,
) -> None:
    """The list's resume-failed link leads to a confirmation stating the filter and the count;
    confirming resumes exactly those instances, not one that matches the filter but failed after
    the confirmation, nor one outside it."""
    _failed(running, "x-1", "x-2", "y-1")
    client = _client(running, allow_actions=True)
    listing = client.get("/instances?workflow=flaky&status=failed&id=x")
    link = re.search(r'id="resume-failed" href="([^"]+)"', listing.text)
    assert link is not None
    confirm = client.get(link.group(1).replace("&amp;", "&"))
    assert re.search(r"<strong>2</strong> failed instances", confirm.text)
    assert '<td id="confirm-workflow">flaky</td>' in confirm.text
    assert '<td id="confirm-id">x</td>' in confirm.text
    until = re.search(r'name="until" value="([^"]+)"', confirm.text)
    assert until is not None
    _failed(running, "x-3")  # fails after the confirmation: not part of it
    done = _post(client, "/resume-failed", confirm, workflow="flaky", id="x",
                 until=until.group(1))
    assert done.status_code == 200
    assert re.findall(r"flaky / (x-\d)</a>", done.text) == ["x-1", "x-2"]
    assert _status(running, "flaky", "y-1") == "Failed"
    assert _status(running, "flaky", "x-3") == "Failed"


# ---------------------------------------------------------------------- access


def _forms(text: str) -> list[str]:
    return re.findall(r'<form method="post"', text)


def test_read_only_shows_no_form_and_refuses_every_post_changing_nothing(
    running: Engine,
) -> None:
    """Without allow_actions no page shows a form or the resume-failed link, and every action
    POST (with a valid CSRF token) is 403 read-only, changing nothing."""
    _suspended(running, "o-1")
    _failed(running, "f-1")
    client = _client(running)
    pages = [client.get(p) for p in ("/", "/instances?status=failed",
                                     _detail("order", "o-1"), _detail("flaky", "f-1"))]
    assert [_forms(p.text) for p in pages] == [[], [], [], []]
    assert 'id="resume-failed"' not in pages[1].text
    csrf = client.get_cookie("memable_csrf")
    assert csrf is not None
    for path, form in (
        ("/instance/signal", {"workflow": "order", "id": "o-1", "key": "approve"}),
        ("/instance/cancel", {"workflow": "order", "id": "o-1"}),
        ("/instance/resume", {"workflow": "flaky", "id": "f-1"}),
        ("/instance/fork", {"workflow": "flaky", "id": "f-1"}),
        ("/resume-failed", {"until": datetime.now(timezone.utc).isoformat()}),
    ):
        refused = client.post(path, data={"csrf": csrf.value, **form})
        assert refused.status_code == 403, path
        assert "read-only" in refused.text
    assert client.get("/resume-failed").status_code == 403
    assert _status(running, "order", "o-1") == "Suspended"
    assert _status(running, "flaky", "f-1") == "Failed"
    assert len(running.list_instances("flaky")) == 1


@pytest.mark.parametrize("csrf", [None, "", "forged"])
def test_a_post_without_this_browsers_csrf_token_is_refused(
    running: Engine, csrf: str | None
) -> None:
    """An action POST with no CSRF token, an empty one, a forged one, or another browser's token
    is refused with 403 and the instance stays suspended."""
    _suspended(running, "o-1")
    client = _client(running, allow_actions=True)
    client.get("/")  # the browser has its cookie
    form = {"workflow": "order", "id": "o-1"}
    if csrf is not None:
        form["csrf"] = csrf
    refused = client.post("/instance/cancel", data=form)
    assert refused.status_code == 403
    assert "CSRF" in refused.text
    # Another browser's token (a page of another site cannot read ours) is refused too.
    other = _client(running, allow_actions=True)
    stolen = _csrf(other.get(_detail("order", "o-1")))
    assert client.post("/instance/cancel", data={**form, "csrf": stolen}).status_code == 403
    assert _status(running, "order", "o-1") == "Suspended"


def test_with_a_token_every_page_is_401_without_it(running: Engine) -> None:
    """With a token set, every page, static file, metrics and POST is 401 without it and shows
    neither data nor the token; the token works as a Bearer header, and given once as ?token= it
    is kept in an HttpOnly, SameSite=Lax cookie and dropped from the URL by a redirect."""
    running.invoke("plain", 1, instance_id="p-1").result(TIMEOUT)
    token = "s3cret-token-value"
    client = _client(running, token=token, allow_actions=True)
    for path in ("/", "/instances", _detail("plain", "p-1"), "/metrics",
                 "/static/live.js", "/no-such-page"):
        refused = client.get(path)
        assert refused.status_code == 401, path
        assert "p-1" not in refused.text
        assert token not in refused.text
    assert client.post("/instance/cancel", data={"workflow": "plain", "id": "p-1"}
                       ).status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {token}"}
                      ).status_code == 200
    # ?token= once: kept in an HttpOnly cookie, and the URL loses it.
    taken = client.get(f"/instances?workflow=plain&token={token}")
    assert taken.status_code == 303
    assert taken.headers["Location"] == "/instances?workflow=plain"
    kept = [c for c in taken.headers.getlist("Set-Cookie") if c.startswith("memable_token=")]
    assert len(kept) == 1
    assert "HttpOnly" in kept[0]
    assert "SameSite=Lax" in kept[0]  # a link from a chat or a mail opens the page
    page = client.get("/instances?workflow=plain")
    assert page.status_code == 200
    assert "p-1" in page.text
    assert token not in page.text


def test_the_redirect_after_the_token_is_relative_whatever_the_host(running: Engine) -> None:
    """The redirect that drops ?token= from the URL is a path of the dashboard, never built
    from the request's Host (which the client chose), nor a "//host" of another site."""
    token = "s3cret-token-value"
    client = _client(running, token=token)
    for path, query, expected in (("/instances", "workflow=plain", "/instances?workflow=plain"),
                                  ("//evil.example/x", "", "/evil.example/x")):
        taken = client.get(path, query_string=f"{query}&token={token}",
                           base_url="http://attacker.example:8321",
                           environ_overrides={"PATH_INFO": path})
        assert taken.status_code == 303
        assert taken.headers["Location"] == expected
        assert token not in taken.text


LOOPBACK = ("localhost:8321", "127.0.0.1:8321", "[::1]:8321", "localhost", "127.0.0.1")


def test_a_dashboard_served_without_a_token_answers_only_its_loopback_names(
    running: Engine,
) -> None:
    """DNS rebinding: with loopback_only (memable ui without a token), a request naming
    another Host is 403 and shows nothing stored; the loopback names, with any port, are
    answered."""
    running.invoke("plain", 1, instance_id="p-1").result(TIMEOUT)
    client = _client(running, loopback_only=True)
    for host in ("attacker.example:8321", "attacker.example", "127.0.0.1.nip.io:8321",
                 "10.0.0.1:8321", "::1"):
        for path in ("/", "/instances?workflow=plain", _detail("plain", "p-1"), "/metrics"):
            refused = client.get(path, headers={"Host": host})
            assert refused.status_code == 403, (host, path)
            assert "p-1" not in refused.text
            assert "memable_csrf" not in refused.headers.get("Set-Cookie", "")
    for host in LOOPBACK:
        page = client.get("/instances?workflow=plain", headers={"Host": host})
        assert page.status_code == 200, host
        assert "p-1" in page.text
    # Mounted in an application (the default), the application checks hosts.
    assert _client(running).get("/", headers={"Host": "ops.example.com"}).status_code == 200


@pytest.mark.parametrize("source", [
    {"Origin": "http://attacker.example:8321"},
    {"Referer": "http://attacker.example:8321/instance?workflow=order&id=o-1"},
    {"Origin": "null"},
    {"Origin": "http://127.0.0.1:9999"},
    {},
])
def test_an_action_from_another_origin_is_refused_without_a_token(
    running: Engine, source: dict[str, str]
) -> None:
    """With loopback_only, a POST carrying this browser's CSRF pair is still refused (403,
    nothing changed) unless its Origin, or its Referer, is the dashboard's own origin."""
    _suspended(running, "o-1")
    client = _client(running, loopback_only=True, allow_actions=True)
    base = "http://127.0.0.1:8321"
    csrf = _csrf(client.get(_detail("order", "o-1"), base_url=base))
    form = {"workflow": "order", "id": "o-1", "csrf": csrf}
    refused = client.post("/instance/cancel", data=form, base_url=base, headers=source)
    assert refused.status_code == 403
    assert "did not come from a page of this dashboard" in refused.text
    assert _status(running, "order", "o-1") == "Suspended"
    # From its own page: the Origin, or (a browser that sends none) the Referer, says so.
    fine = client.post("/instance/signal", data={**form, "key": "approve"}, base_url=base,
                       headers={"Origin": base})
    assert fine.status_code == 303
    assert running.invocation("order", "o-1").result(TIMEOUT) == "book: None"
    _suspended(running, "o-2")
    fine = client.post("/instance/cancel", data={**form, "id": "o-2"}, base_url=base,
                       headers={"Referer": base + _detail("order", "o-2")})
    assert fine.status_code == 303
    assert _status(running, "order", "o-2") == "Cancelled"


def _serve_ui(db: Any, *options: str) -> tuple[subprocess.Popen[str], int]:
    """A real `memable ui DB --port 0 OPTIONS` process; it and the port it serves on."""
    ui = subprocess.Popen([sys.executable, "-u", "-m", "memable", "ui", str(db), "--port", "0",
                           *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "MEMABLE_UI_TOKEN": ""})
    assert ui.stdout is not None
    told = ui.stdout.readline()
    found = re.search(r"serving http://127\.0\.0\.1:(\d+)/", told)
    assert found is not None, (told, ui.stderr.read() if ui.poll() is not None else "")
    return ui, int(found.group(1))


def _raw_get(port: int, target: str, host: str) -> tuple[int, dict[str, str], str]:
    """One HTTP/1.1 GET over a plain socket with exactly this Host header."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.decode("utf-8", "replace").partition("\r\n\r\n")
    status_line, *lines = head.split("\r\n")
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def _stop_ui(ui: subprocess.Popen[str]) -> str:
    """SIGINT (Ctrl-C) the ui process; its stderr, the access log."""
    ui.send_signal(signal.SIGINT)
    _, err = ui.communicate(timeout=TIMEOUT)
    return err


def test_memable_ui_without_a_token_refuses_a_rebound_host(tmp_path: Any) -> None:
    """The real `memable ui` server on loopback without a token: a raw request naming
    `Host: attacker.example:PORT` (a DNS-rebound page) is 403 and shows nothing stored;
    `Host: 127.0.0.1:PORT` is answered."""
    ui, port = _serve_ui(_file_with_one_instance(tmp_path), "--allow-actions")
    try:
        status, _, body = _raw_get(port, "/instances?workflow=plain", f"attacker.example:{port}")
        assert status == 403
        assert "p-1" not in body
        status, _, body = _raw_get(port, "/instances?workflow=plain", f"127.0.0.1:{port}")
        assert status == 200
        assert "p-1" in body
    finally:
        err = _stop_ui(ui)
    assert re.search(r"GET /instances\?workflow=plain HTTP/1.1\S*\" 403", err), err


def test_memable_ui_never_logs_or_redirects_with_its_token(tmp_path: Any) -> None:
    """The real `memable ui --token T`: ?token=T is answered with a relative redirect that
    names neither the token nor the request's Host, and its access log (stderr) has the
    request line with the token hidden, never the token."""
    token = "s3cret-ui-token-4711"
    ui, port = _serve_ui(_file_with_one_instance(tmp_path), "--token", token)
    try:
        status, headers, body = _raw_get(port, f"/instances?workflow=plain&token={token}",
                                         f"attacker.example:{port}")
        assert status == 303
        assert headers["location"] == "/instances?workflow=plain"
        assert token not in body
        status, _, body = _raw_get(port, f"/?token=wrong-{token}", f"127.0.0.1:{port}")
        assert status == 401
        assert token not in body
    finally:
        err = _stop_ui(ui)
    assert "/instances?workflow=plain&token=[hidden]" in err
    assert token not in err


def test_ui_refuses_to_serve_other_machines_without_a_token(tmp_path: Any) -> None:
    """``memable ui --host 0.0.0.0`` with no token exits 2, asking for a --token."""
    path = tmp_path / "app.db"
    Engine.open(path).close()
    result = CliRunner().invoke(main, ["ui", str(path), "--host", "0.0.0.0"], env={
        "MEMABLE_UI_TOKEN": ""})
    assert result.exit_code == 2
    assert "give a --token" in result.output


def _file_with_one_instance(tmp_path: Any) -> Any:
    """A store file holding one completed instance, plain/p-1; its path."""
    path = tmp_path / "app.db"
    engine = Engine.open(path)
    engine.register("plain", lambda ctx, x: x)
    with engine:
        engine.invoke("plain", 1, instance_id="p-1").result(TIMEOUT)
    return path


def test_ui_on_a_taken_port_says_so_with_exit_2(tmp_path: Any) -> None:
    """``memable ui`` on a port another socket holds exits 2, saying it cannot serve on that
    address."""
    import socket

    path = _file_with_one_instance(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["ui", str(path), "--port", str(port)])
    assert result.exit_code == 2
    assert f"cannot serve on 127.0.0.1:{port}" in result.output


def test_ui_serves_the_dashboard_until_shut_down(tmp_path: Any) -> None:
    """memable ui's server, on a free port, answers over a real socket and stops."""
    import urllib.request

    from memable.web.serve import bind, serve

    dashboard = app(_file_with_one_instance(tmp_path))
    server = bind(dashboard, "127.0.0.1", 0)
    told: list[str] = []
    thread = threading.Thread(target=serve, args=(server,),
                              kwargs={"read_only": True, "announce": told.append},
                              name="test-ui", daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/"
        with urllib.request.urlopen(url + "instances", timeout=TIMEOUT) as answer:
            assert "p-1" in answer.read().decode()
        assert told == [f"memable ui: serving {url} (read-only); Ctrl-C stops it"]
    finally:
        server.shutdown()
        thread.join(TIMEOUT)
        dashboard.close()
    assert not thread.is_alive()


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("path", "status", "says"), [
    ("/instances?page=x", 400, "page must be a whole number"),
    ("/instances?page=0", 400, "page must be a whole number"),
    ("/instances?page=-1", 400, "page must be a whole number"),
    ("/instances?status=lost", 400, "status must be one of"),
    ("/instance?workflow=plain&id=nope", 404, "no stored instance"),
    ("/instance?workflow=nope&id=p-1", 404, "the store has no instance of this workflow"),
    ("/instance?workflow=plain", 400, "a workflow and an instance id are needed"),
    ("/no-such-page", 404, "Not Found"),
    ("/instance/cancel", 405, "not allowed"),
    ("/static/../app.py", 404, ""),
])
def test_bad_requests_get_a_page_that_says_so(
    running: Engine, path: str, status: int, says: str
) -> None:
    """Malformed queries, unknown instances or workflows, unknown pages, a GET of an action and
    a path escaping the static folder each get the fitting 400, 404 or 405 page saying why."""
    running.invoke("plain", 1, instance_id="p-1").result(TIMEOUT)
    page = _client(running).get(path)
    assert page.status_code == status
    assert says in page.text


def test_a_malformed_payload_is_400_and_changes_nothing(running: Engine) -> None:
    """A signal whose payload is not JSON is 400, naming the key, and stores nothing; a signal
    to an unknown instance is 404."""
    _suspended(running, "o-1")
    before = running.steps("order", "o-1")
    client = _client(running, allow_actions=True)
    page = client.get(_detail("order", "o-1"))
    refused = _post(client, "/instance/signal", page, workflow="order", id="o-1",
                    key="approve", payload="{not json")
    assert refused.status_code == 400
    assert "the payload is not JSON" in refused.text
    assert "approve" in refused.text
    assert running.steps("order", "o-1") == before
    assert _status(running, "order", "o-1") == "Suspended"
    unknown = _post(client, "/instance/signal", page, workflow="order", id="o-2",
                    key="approve", payload="1")
    assert unknown.status_code == 404


def test_a_bulk_resume_without_a_confirmed_time_is_400(running: Engine) -> None:
    """A bulk resume whose confirmed time is empty, not a time, or a time with no UTC offset is
    400 and resumes nothing."""
    _failed(running, "f-1")
    client = _client(running, allow_actions=True)
    page = client.get("/resume-failed")
    for until in ("", "yesterday", "2026-12-05T10:00:00"):
        refused = _post(client, "/resume-failed", page, until=until)
        assert refused.status_code == 400
    assert _status(running, "flaky", "f-1") == "Failed"


# ---------------------------------------------------------------------- escaping


def _escaping_case(engine: Engine, field: str) -> tuple[str, str]:
    """Store ``SCRIPT`` in ``field`` of an instance; return its (workflow, id)."""
    if field == "instance id":
        engine.invoke("plain", 1, instance_id=SCRIPT).result(TIMEOUT)
        return "plain", SCRIPT
    if field == "input":
        engine.invoke("plain", {"note": SCRIPT}, instance_id="i").result(TIMEOUT)
    elif field == "output":
        engine.invoke("out", instance_id="i").result(TIMEOUT)
        return "out", "i"
    elif field == "status message":
        engine.invoke("status", instance_id="i").result(TIMEOUT)
        return "status", "i"
    elif field == "step key":
        engine.invoke("keyed", instance_id="i").result(TIMEOUT)
        return "keyed", "i"
    elif field == "step result":
        engine.invoke("result", instance_id="i").result(TIMEOUT)
        return "result", "i"
    elif field == "error":
        engine.invoke("error", instance_id="i").wait(TIMEOUT)
        return "error", "i"
    elif field == "workflow name":
        engine.invoke(SCRIPT, instance_id="i").result(TIMEOUT)
        return SCRIPT, "i"
    return "plain", "i"


@pytest.mark.parametrize("field", [
    "instance id", "input", "output", "status message", "step key", "step result",
    "error", "workflow name",
])
def test_everything_stored_is_shown_as_text(running: Engine, field: str) -> None:
    """Markup stored in any field (instance id, input, output, status message, step key or
    result, error, workflow name) is escaped on every page that shows it, and the pages forbid
    inline scripts."""
    workflow, instance_id = _escaping_case(running, field)
    client = _client(running, allow_actions=True)
    detail = client.get(_detail(workflow, instance_id))
    listing = client.get("/instances")
    overview = client.get("/")
    live = client.get("/instance/live?" + urlencode({"workflow": workflow,
                                                     "id": instance_id}))
    for page in (detail, listing, overview, live):
        assert page.status_code == 200
        assert SCRIPT not in page.text
        assert "<script>alert" not in page.text
    assert "&lt;script&gt;alert(" in detail.text  # shown, as text
    assert "script-src 'self'" in detail.headers["Content-Security-Policy"]


def test_app_opens_a_store_by_path_and_refuses_a_missing_one(tmp_path: Any) -> None:
    """``app()`` given a file path opens the store as a Dashboard; a missing file is refused,
    and a value that is no path, URL or Engine is a TypeError."""
    dashboard = app(_file_with_one_instance(tmp_path))
    try:
        assert isinstance(dashboard, Dashboard)
        assert "p-1" in Client(dashboard).get("/instances").text
    finally:
        dashboard.close()
    with pytest.raises(Exception, match="no such file"):
        app(tmp_path / "missing.db")
    with pytest.raises(TypeError, match="a path, a postgresql:// URL or an Engine"):
        app(42)  # type: ignore[arg-type]


def test_step_not_found_is_a_value_error_naming_the_keys() -> None:
    """StepNotFound is a ValueError that names the key asked for and carries the keys the
    instance has."""
    err = StepNotFound("wf", "i-1", "x", ["a", "b"])
    assert isinstance(err, ValueError)
    assert err.keys == ["a", "b"]
    assert "'a', 'b'" in str(err)
    assert "step 'x'" in str(err)


def test_the_overview_shows_queues_with_limits_and_schedules_with_ticks(
    open_shared: Callable[..., Engine],
) -> None:
    """A web engine enqueues (it consumes nothing); the consuming engine's declaration,
    stored with its owner row, gives the queue's limits; the schedule shows its next
    tick. (Two engines on one store: a file, or PostgreSQL.)"""
    web = open_shared(queues=())
    web.queue("mail", concurrency=2, rate=(10, 60.0))
    web.register("send", lambda ctx: None, queue="mail")
    web.schedule("nightly", "0 3 * * *", "send")
    consumer = open_shared(poll_interval=0.05)
    consumer.queue("mail", concurrency=2, rate=(10, 60.0))
    consumer.register("send", lambda ctx: None, queue="mail")
    with web:
        web.invoke("send", instance_id="waiting")
        page = _client(web).get("/")
        assert ["mail", "1", "0", page_age(page), "no running engine consumes it", "0",
                "no"] in _rows(page, "queues")
        with consumer:
            web.invocation("send", "waiting").result(TIMEOUT)
            page = _client(web).get("/")
            assert ["mail", "0", "0", "-", "concurrency 2, rate 10 per 60 s", "1", "no"] in \
                _rows(page, "queues")
    [_, schedule] = _rows(page, "schedules")
    assert schedule[:4] == ["nightly", "0 3 * * *", "UTC", "send"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT03:00(:00)?(\+00:00|Z)?", schedule[5]), schedule[5]


def page_age(page: TestResponse) -> str:
    """The oldest-queued cell of the queue ``mail`` as shown (seconds, one decimal)."""
    for row in _rows(page, "queues"):
        if row[0] == "mail":
            assert re.fullmatch(r"\d+\.\d s", row[3]), row[3]
            return row[3]
    raise AssertionError("no queue mail")
