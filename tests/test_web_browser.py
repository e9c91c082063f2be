"""The dashboard in a real browser: headless Chromium, driven by Selenium, over a SQLite
file a running engine works on.

One engine (polling every 0.1 s) runs the workflows below on the file for the whole
module, so what a page asks for (a signal, a resume, a fork) is done and the page shows
it, as an operator sees it. Two dashboards serve the same file on Werkzeug's threaded
server: one with actions, one read-only; each notes the forms POSTed to it (POSTED), so
a test can say what the browser sent. Waits are WebDriverWait's, never sleeps.

Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver);
without them the cases are skipped, and with CI=true they fail instead (.ci/run installs
them). ``MEMABLE_SCREENSHOTS=DIR`` saves the screenshots of docs/images/ into DIR.
"""

from __future__ import annotations

import io
import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from helpers import build, store_of
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait
from werkzeug.serving import make_server

from memable import Context, Engine, Failed, Suspended
from memable.web import Dashboard, app
from memable.web.pages import PAGE_SIZE

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: The longest any wait here takes: a live page polls every 2 s, the engine every 0.1 s.
WAIT = 30.0

#: Markup that runs script if a page ever puts it in unescaped.
XSS = '<script>window.__xss=1</script> <img src=x onerror="window.__xss=1">'
XSS_ID = f"xss {XSS}"

# ---------------------------------------------------------------------- the workflows

_lock = threading.Lock()
#: How many times each (instance, step key) executed (a replay does not count).
EXECUTED: Counter[tuple[str, str]] = Counter()
#: The instances of ``flaky`` whose charge failed once already.
FAILED_ONCE: set[str] = set()


def _counted(ctx: Context, key: str, value: Any) -> Any:
    with _lock:
        EXECUTED[ctx.instance_id, key] += 1
    return value


def ship(ctx: Context, order: str) -> str:
    return ctx.step("pack:v1").run(lambda: f"parcel for {order}")


def order(ctx: Context, order: str) -> dict[str, Any]:
    ctx.set_status("fetching the order")
    items = ctx.step("fetch:v1").run(lambda: ["tea", "cups"])
    parcel = ctx.child("ship:v1", "ship", order)
    return {"items": items, "parcel": parcel}


def approval(ctx: Context, amount: int) -> dict[str, Any]:
    decision = ctx.suspend("approve:v1", status="waiting for a manager")
    return {"amount": amount, "decision": decision}


def flaky(ctx: Context, n: int) -> int:
    """Its charge fails the first time it runs for an instance, then works."""
    ctx.step("prepare:v1").run(lambda: n)

    def charge() -> int:
        with _lock:
            first = ctx.instance_id not in FAILED_ONCE
            FAILED_ONCE.add(ctx.instance_id)
        if first:
            raise ConnectionError("payment gateway timed out (simulated, once)")
        return n * 2

    return ctx.step("charge:v1").run(charge)


def pipeline(ctx: Context, n: int) -> int:
    a = ctx.step("extract:v1").run(lambda: _counted(ctx, "extract:v1", n))
    b = ctx.step("transform:v1").run(lambda: _counted(ctx, "transform:v1", a * 10))
    return int(ctx.step("load:v1").run(lambda: _counted(ctx, "load:v1", b + 1)))


def tick(ctx: Context, n: int) -> int:
    return n


def notify(ctx: Context, to: str) -> str:
    return ctx.step("send:v1").run(lambda: f"sent to {to}")


def report(ctx: Context) -> str:
    return "report"


def hostile(ctx: Context, text: str) -> dict[str, str]:
    """Markup in every place a page shows: status message, step keys, a step's error and
    result, and the output (the id and input come from the test)."""
    ctx.set_status(f"status {XSS}")
    ctx.step(f"key {XSS}").run(lambda: f"result {XSS}")

    def fail() -> None:
        raise ValueError(f"error {XSS}")

    with suppress(ValueError):  # the step is recorded failed; the workflow goes on
        ctx.step(f"failing {XSS}").run(fail)
    return {"out": f"output {XSS}"}


WORKFLOWS: dict[str, Callable[..., Any]] = {
    "ship": ship, "order": order, "approval": approval, "flaky": flaky,
    "pipeline": pipeline, "tick": tick, "hostile": hostile, "report": report,
}

# ---------------------------------------------------------------------- fixtures


def browser_or_skip() -> None:
    """Skip the test, saying why, when chromium or its driver is missing; under CI
    (CI=true) fail instead (as tests/conftest.py's postgres_or_skip does)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        why = (f"no browser for the dashboard's browser tests: {', '.join(missing)} missing "
               "(apt-get install chromium chromium-driver)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}; under CI the browser cases must run")
        pytest.skip(why)


@pytest.fixture(scope="module", autouse=True)
def _browser_installed() -> None:
    browser_or_skip()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard") / "memable.db"


@pytest.fixture(scope="module")
def engine(store: Path) -> Iterator[Engine]:
    """The engine that runs every workflow on the store, started, with a few instances of
    each (the hostile one and the ticks first, so the newest page of the list shows the
    others), a queue and a schedule for the overview's tables (its workflow is its own:
    a tick falling in a run, at New Year, changes no count a test reads)."""
    engine = build(store, poll_interval=0.1, synchronous="normal").engine
    for name, fn in WORKFLOWS.items():
        engine.register(name, fn)
    engine.queue("mail", concurrency=2, rate=(10, 60))
    engine.register("notify", notify, queue="mail")
    engine.schedule("new-year-report", "0 0 1 1 *", "report", catch_up="none")
    engine.start()
    try:
        engine.invoke("hostile", f"input {XSS}", instance_id=XSS_ID).result(WAIT)
        for n in range(PAGE_SIZE + 1):
            engine.invoke("tick", n, instance_id=f"tick-{n:03}").result(WAIT)
        engine.invoke("notify", "ada@example.org", instance_id="notify-1").result(WAIT)
        engine.invoke("pipeline", 1, instance_id="pipeline-1").result(WAIT)
        assert isinstance(engine.invoke("flaky", 1, instance_id="flaky-1").wait(WAIT), Failed)
        for n in (1, 2):
            engine.invoke("order", f"#{n}", instance_id=f"order-{n}").result(WAIT)
        waiting = engine.invoke("approval", 9, instance_id="approval-1").wait(WAIT)
        assert isinstance(waiting, Suspended)
        yield engine
    finally:
        engine.close()


#: Each POST a dashboard here received, in order: (path, its form), as the browser sent it.
POSTED: list[tuple[str, dict[str, list[str]]]] = []


def posted(path: str) -> dict[str, list[str]]:
    """The form of the last POST to ``path``."""
    with _lock:
        return [form for at, form in POSTED if at == path][-1]


def recording(dashboard: Dashboard) -> Callable[[Any, Any], Iterable[bytes]]:
    """``dashboard``, noting each POST's form in POSTED first (what the page sent)."""
    def wsgi(environ: Any, start_response: Any) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] == "POST":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            with _lock:
                POSTED.append((environ["PATH_INFO"], parse_qs(body.decode())))
        return dashboard(environ, start_response)
    return wsgi


@contextmanager
def serving(store: Path, *, allow_actions: bool, name: str) -> Iterator[str]:
    """The dashboard over ``store`` on a Werkzeug server in a thread; its base URL."""
    dashboard = app(store, allow_actions=allow_actions)
    server = make_server("127.0.0.1", 0, recording(dashboard), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name=f"dashboard-{name}",
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=WAIT)
        server.server_close()
        dashboard.close()
        assert not thread.is_alive(), f"the {name} dashboard's server did not stop"


@pytest.fixture(scope="module")
def actions_url(store: Path, engine: Engine) -> Iterator[str]:
    with serving(store, allow_actions=True, name="actions") as url:
        yield url


@pytest.fixture(scope="module")
def readonly_url(store: Path, engine: Engine) -> Iterator[str]:
    with serving(store, allow_actions=False, name="read-only") as url:
        yield url


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1280,900"):
        options.add_argument(argument)
    # The driver's path given: Selenium Manager never looks for (or downloads) one.
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield browser
    finally:
        browser.quit()


# ---------------------------------------------------------------------- helpers


def wait(driver: WebDriver, timeout: float = WAIT) -> WebDriverWait[WebDriver]:
    """A wait that looks again while the page is being replaced (a live page swaps its
    fragment every 2 s; a reload or a navigation replaces everything): see ``navigate``
    for why any WebDriverException counts as such."""
    return WebDriverWait(driver, timeout, poll_frequency=0.05,
                         ignored_exceptions=(WebDriverException,))


def text(driver: WebDriver, css: str) -> str:
    """The text of the element ``css`` finds, read again if the page replaced it."""
    found: tuple[str] = wait(driver).until(
        lambda d: (d.find_element(By.CSS_SELECTOR, css).text,))
    return found[0]


def navigate(driver: WebDriver, act: Callable[[], object]) -> None:
    """Do ``act``, which leaves the page, and wait until the next page has loaded.

    The page left is told by a mark in its window, not by an element of it going stale:
    while a navigation commits, chromedriver may answer a command about the old page's
    element with "Node with given id does not belong to the document" (an unknown
    error, not a stale element; SeleniumHQ/selenium#15401). The same may answer a
    script run in that moment, so the wait looks again on any WebDriverException.
    """
    mark = uuid.uuid4().hex
    driver.execute_script("window.__leaving = arguments[0]", mark)
    act()
    wait(driver).until(lambda d: d.execute_script(
        "return window.__leaving !== arguments[0] && document.readyState === 'complete'",
        mark), f"no new page loaded after {act!r}")


def click(driver: WebDriver, css: str) -> None:
    """Click the element ``css`` finds and wait for the page it leads to.

    Once: a click that raised may still have started its navigation, and clicking again
    would act on whichever page is there by then. (Nothing clicked here is inside a live
    page's fragment, which the page replaces every 2 s.)
    """
    element = driver.find_element(By.CSS_SELECTOR, css)
    navigate(driver, element.click)


def query(driver: WebDriver) -> dict[str, list[str]]:
    return parse_qs(urlsplit(driver.current_url).query)


def detail(base: str, workflow: str, instance_id: str) -> str:
    return f"{base}/instance?{urlencode({'workflow': workflow, 'id': instance_id})}"


def wait_ended(driver: WebDriver, status: str) -> None:
    """Wait until the page shows the instance ``status`` as a page of an ended instance:
    loaded (by the test, or by live.js's reload) without the live script."""
    wait(driver).until(lambda d: (
        d.execute_script("return document.readyState") == "complete"
        and not d.find_elements(By.CSS_SELECTOR, "script[src*='live.js']")
        and d.find_element(By.ID, "status").text == status
    ), f"the page never showed the instance {status}")


def status_of(engine: Engine, workflow: str, instance_id: str) -> str:
    metadata = engine.get_metadata(workflow, instance_id)
    assert metadata is not None
    return metadata.status.name


def no_script_ran(driver: WebDriver) -> None:
    """Nothing the store holds became markup: no script or image in the page's main part,
    and the payloads' assignment never ran (the CSP would also stop an inline script; the
    first check does not rely on it)."""
    assert driver.find_elements(By.CSS_SELECTOR, "main script, main img, main iframe") == []
    assert driver.execute_script("return window.__xss") is None


def screenshot(driver: WebDriver, name: str) -> None:
    """Save the window as ``name`` in $MEMABLE_SCREENSHOTS, if set (the docs' images)."""
    where = os.environ.get("MEMABLE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(Path(where) / name))


def inject_post(driver: WebDriver, action: str, fields: dict[str, str]) -> None:
    """Submit, from the current page, a POST form made by script (what no page offers)."""
    navigate(driver, lambda: driver.execute_script(
        """
        const form = document.createElement("form");
        form.method = "post";
        form.action = arguments[0];
        for (const [name, value] of Object.entries(arguments[1])) {
            const input = document.createElement("input");
            input.type = "hidden"; input.name = name; input.value = value;
            form.appendChild(input);
        }
        document.body.appendChild(form);
        form.submit();
        """, action, fields))


# ---------------------------------------------------------------------- reading


def test_navigation_overview_list_detail_parent_and_child(
    driver: WebDriver, actions_url: str
) -> None:
    """In a real browser, the overview's counts, queues and schedules, the instance list, a
    count's filtered list, an instance's page, its child and back to the parent, and the metrics
    page are all reached by clicking links, each showing what the store holds."""
    driver.get(actions_url + "/")
    assert text(driver, "h1") == "Overview"
    counts = driver.find_element(By.ID, "counts")
    order_row = counts.find_element(By.XPATH, ".//tr[td/a[text()='order']]")
    assert order_row.find_element(By.CSS_SELECTOR, "a.status-completed").text == "2"
    [queue] = driver.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
    assert [td.text for td in queue.find_elements(By.TAG_NAME, "td")] \
        == ["mail", "0", "0", "-", "concurrency 2, rate 10 per 60 s", "1", "no", "Pause"]
    [schedule] = driver.find_elements(By.CSS_SELECTOR, "#schedules tbody tr")
    assert schedule.text.startswith("new-year-report 0 0 1 1 * UTC report")
    screenshot(driver, "dashboard-overview.png")

    click(driver, "#nav-instances")
    assert urlsplit(driver.current_url).path == "/instances"
    links = [a.text for a in driver.find_elements(By.CSS_SELECTOR, ".instance-link")]
    assert {"order-1", "order-1/ship:v1", "approval-1", "flaky-1"} <= set(links)
    screenshot(driver, "dashboard-instances.png")

    navigate(driver, driver.back)
    click(driver, "#counts a[href='/instances?workflow=order']")
    assert query(driver) == {"workflow": ["order"]}
    assert Select(driver.find_element(By.ID, "filter-workflow")) \
        .first_selected_option.get_attribute("value") == "order"
    assert sorted(a.text for a in driver.find_elements(By.CSS_SELECTOR, ".instance-link")) \
        == ["order-1", "order-2"]

    click(driver, ".instance-link[href$='id=order-1']")
    assert text(driver, "#instance-id") == "order-1"
    assert text(driver, "#status") == "completed"
    assert text(driver, "#status-message") == "fetching the order"
    keys = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#steps td.key")]
    assert keys == ["fetch:v1", "ship:v1"]
    assert '"parcel": "parcel for #1"' in text(driver, "#output")
    screenshot(driver, "dashboard-instance.png")

    click(driver, "#children a")
    assert text(driver, "#instance-id") == "order-1/ship:v1"
    assert text(driver, "h1 a") == "ship"
    assert [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#steps td.key")] \
        == ["pack:v1"]
    assert text(driver, "#parent") == "order / order-1"

    click(driver, "#parent")
    assert text(driver, "#instance-id") == "order-1"
    click(driver, "h1 a")
    assert query(driver) == {"workflow": ["order"]}

    click(driver, "#nav-metrics")
    assert 'memable_instances{workflow="order",status="completed"} 2' \
        in driver.find_element(By.TAG_NAME, "body").text


def test_filter_stays_in_the_url_and_across_back_and_forward(
    driver: WebDriver, actions_url: str, engine: Engine
) -> None:
    """A filter chosen in the list's form goes into the URL and comes back, with the form's
    fields set and the same rows, when the browser goes back to the list from an instance and
    forward again."""
    for n in (1, 2, 3):
        engine.invoke("approval", n, instance_id=f"filter-{n}").wait(WAIT)
    engine.signal("approval", "filter-3", "approve:v1", "yes").result(WAIT)
    engine.invoke("flaky", 4, instance_id="filter-4").wait(WAIT)  # failed

    driver.get(actions_url + "/instances")
    Select(driver.find_element(By.ID, "filter-workflow")).select_by_value("approval")
    Select(driver.find_element(By.ID, "filter-status")).select_by_value("suspended")
    driver.find_element(By.ID, "filter-id").send_keys("filter-")
    click(driver, "#filter-apply")

    wanted = {"workflow": ["approval"], "status": ["suspended"], "id": ["filter-"]}

    def holds_the_filter() -> None:
        assert query(driver) == wanted
        for select, value in (("filter-workflow", "approval"), ("filter-status", "suspended")):
            chosen = Select(driver.find_element(By.ID, select)).first_selected_option
            assert chosen.get_attribute("value") == value
        assert driver.find_element(By.ID, "filter-id").get_attribute("value") == "filter-"
        rows = driver.find_elements(By.CSS_SELECTOR, "#instances tbody tr")
        assert sorted(r.find_element(By.CSS_SELECTOR, ".instance-link").text for r in rows) \
            == ["filter-1", "filter-2"]
        assert {r.find_element(By.CSS_SELECTOR, "td.status-suspended").text for r in rows} \
            == {"suspended"}

    holds_the_filter()
    click(driver, ".instance-link[href$='id=filter-2']")
    assert text(driver, "#instance-id") == "filter-2"

    navigate(driver, driver.back)
    holds_the_filter()

    navigate(driver, driver.forward)
    assert text(driver, "#instance-id") == "filter-2"
    assert query(driver) == {"workflow": ["approval"], "id": ["filter-2"]}

    navigate(driver, driver.back)
    holds_the_filter()


def test_pages_keep_the_filter(driver: WebDriver, actions_url: str) -> None:
    """Paging through a filtered list keeps the filter in each page's URL and form; the last
    page holds the oldest instance and no next link."""
    driver.get(actions_url + "/instances?workflow=tick")
    assert len(driver.find_elements(By.CSS_SELECTOR, ".instance-link")) == PAGE_SIZE
    assert driver.find_elements(By.ID, "page-prev") == []

    click(driver, "#page-next")
    assert query(driver) == {"workflow": ["tick"], "page": ["2"]}
    assert text(driver, "#page") == "page 2"
    assert [a.text for a in driver.find_elements(By.CSS_SELECTOR, ".instance-link")] \
        == ["tick-000"]  # newest first: the oldest is on the last page
    assert driver.find_elements(By.ID, "page-next") == []
    assert Select(driver.find_element(By.ID, "filter-workflow")) \
        .first_selected_option.get_attribute("value") == "tick"

    click(driver, "#page-prev")
    assert query(driver) == {"workflow": ["tick"], "page": ["1"]}
    assert len(driver.find_elements(By.CSS_SELECTOR, ".instance-link")) == PAGE_SIZE


def test_live_page_follows_the_instance_to_its_end(
    driver: WebDriver, actions_url: str, engine: Engine
) -> None:
    """A suspended instance's page refreshes its fragment in place while nothing changes, and
    once a signal completes the instance, live.js reloads the page by itself to show the output,
    with the signal form gone."""
    engine.invoke("approval", 7, instance_id="live-1").wait(WAIT)
    driver.get(detail(actions_url, "approval", "live-1"))
    assert text(driver, "#status") == "suspended"
    assert driver.find_element(By.ID, "live").get_attribute("data-every") == "2000"
    driver.execute_script("window.__loadedByTheTest = true")  # a reload forgets it
    # The script fetches the fragment and puts it in place while nothing changed.
    wait(driver).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#live[data-updated]")))
    assert text(driver, "#status") == "suspended"

    engine.signal("approval", "live-1", "approve:v1", "granted").result(WAIT)

    # The test never reloads: live.js sees the end in a fragment and reloads the page.
    wait_ended(driver, "completed")
    assert driver.execute_script("return window.__loadedByTheTest") is None
    assert driver.execute_script(
        "return performance.getEntriesByType('navigation')[0].type") == "reload"
    assert '"decision": "granted"' in text(driver, "#output")
    assert driver.find_elements(By.ID, "signal-form") == []


# ---------------------------------------------------------------------- actions


def test_signal_with_a_json_payload(
    driver: WebDriver, actions_url: str, engine: Engine
) -> None:
    """The signal form posts the JSON payload typed (non-ASCII text included) as is; the page
    says it was delivered, then shows the completed instance with that value in its output."""
    engine.invoke("approval", 3, instance_id="signal-1").wait(WAIT)
    driver.get(detail(actions_url, "approval", "signal-1"))
    assert driver.find_element(By.ID, "signal-key").get_attribute("value") == "approve:v1"
    payload = driver.find_element(By.ID, "signal-payload")
    payload.clear()
    payload.send_keys('{"by": "ada", "ok": true, "note": "ça va"}')
    click(driver, "#signal-send")

    assert posted("/instance/signal")["payload"] == ['{"by": "ada", "ok": true, "note": "ça va"}']
    assert query(driver) == {"workflow": ["approval"], "id": ["signal-1"], "done": ["signal"]}
    assert text(driver, "#done") == "Signal delivered."
    wait_ended(driver, "completed")
    assert text(driver, "#done") == "Signal delivered."
    output = text(driver, "#output")
    assert '"by": "ada"' in output
    assert '"note": "ça va"' in output
    assert engine.invocation("approval", "signal-1").result(WAIT) == {
        "amount": 3, "decision": {"by": "ada", "ok": True, "note": "ça va"}}


def test_malformed_json_payload_gets_400_and_changes_nothing(
    driver: WebDriver, actions_url: str, engine: Engine
) -> None:
    """A signal payload that is not JSON gets the 400 page naming the instance and key, and the
    instance stays suspended on that key with its steps unchanged."""
    engine.invoke("approval", 4, instance_id="badjson-1").wait(WAIT)
    before = (engine.get_metadata("approval", "badjson-1"),
              engine.steps("approval", "badjson-1"))
    driver.get(detail(actions_url, "approval", "badjson-1"))
    payload = driver.find_element(By.ID, "signal-payload")
    payload.clear()
    payload.send_keys('{"by": ')
    click(driver, "#signal-send")

    assert text(driver, "h1") == "400"
    assert driver.title.startswith("400")
    message = text(driver, "#error")
    assert message.startswith("the payload is not JSON")
    assert "'badjson-1'" in message
    assert "'approve:v1'" in message
    assert (engine.get_metadata("approval", "badjson-1"),
            engine.steps("approval", "badjson-1")) == before

    driver.get(detail(actions_url, "approval", "badjson-1"))
    assert text(driver, "#status") == "suspended"
    assert text(driver, "#awaiting") == "approve:v1"


def test_cancel(driver: WebDriver, actions_url: str, engine: Engine) -> None:
    """The Cancel button ends a suspended instance: the page says so, shows it cancelled, and
    offers no signal, cancel or resume any more."""
    engine.invoke("approval", 5, instance_id="cancel-1").wait(WAIT)
    driver.get(detail(actions_url, "approval", "cancel-1"))
    click(driver, "#cancel")

    assert text(driver, "#done") == "Cancelled."
    wait_ended(driver, "cancelled")
    for gone in ("signal-form", "cancel", "resume"):
        assert driver.find_elements(By.ID, gone) == []
    assert status_of(engine, "approval", "cancel-1") == "cancelled"


def test_resume_a_failed_instance(
    driver: WebDriver, actions_url: str, engine: Engine
) -> None:
    """A failed instance's page shows its traceback; Resume marks it, the engine runs it again,
    and the page follows it to completed with both steps done."""
    assert isinstance(engine.invoke("flaky", 21, instance_id="resume-1").wait(WAIT), Failed)
    driver.get(detail(actions_url, "flaky", "resume-1"))
    assert text(driver, "#status") == "failed"
    assert "ConnectionError: payment gateway timed out" in text(driver, "#traceback")
    click(driver, "#resume")

    assert text(driver, "#done").startswith("Marked to resume")
    wait_ended(driver, "completed")  # the engine took it; live.js showed the end
    assert text(driver, "#output") == "42"
    assert [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#steps td[class^=state]")] \
        == ["completed", "completed"]


def test_fork_from_a_step(driver: WebDriver, actions_url: str, engine: Engine) -> None:
    """Fork from a chosen step makes a new instance and opens its page; the step before the
    chosen one is copied from the source (its completion time the source's) while the chosen one
    and the one after it execute again, and the source stays completed."""
    engine.invoke("pipeline", 5, instance_id="fork-src").result(WAIT)
    driver.get(detail(actions_url, "pipeline", "fork-src"))
    options = [o.get_attribute("value") for o in
               Select(driver.find_element(By.ID, "fork-from")).options]
    assert options == ["extract:v1", "transform:v1", "load:v1", ""]
    Select(driver.find_element(By.ID, "fork-from")).select_by_value("transform:v1")
    assert Select(driver.find_element(By.ID, "fork-from")).first_selected_option \
        .get_attribute("value") == "transform:v1"
    click(driver, "#fork")
    assert posted("/instance/fork")["from_key"] == ["transform:v1"]

    [new_id] = query(driver)["id"]
    assert new_id.startswith("fork-src.fork-")
    assert query(driver)["done"] == ["fork"]
    assert text(driver, "#instance-id") == new_id
    assert text(driver, "#done").startswith("Forked: this is the new instance")
    wait_ended(driver, "completed")  # the engine ran it
    assert text(driver, "#output") == "51"
    assert [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#steps td.key")] \
        == ["extract:v1", "transform:v1", "load:v1"]
    # The step before the chosen one is the source's memo, copied (its time is the
    # source's); the chosen step and the one after it executed again.
    source = {s.key: s.completed_at for s in engine.steps("pipeline", "fork-src")}
    forked = engine.steps("pipeline", new_id)
    assert [s.key for s in forked if s.completed_at == source[s.key]] == ["extract:v1"], \
        forked
    with _lock:
        executed = [EXECUTED[new_id, key] for key in ("extract:v1", "transform:v1", "load:v1")]
    assert executed == [0, 1, 1], forked
    assert status_of(engine, "pipeline", "fork-src") == "completed"


def test_resume_the_failed_of_a_filter(
    driver: WebDriver, actions_url: str, engine: Engine
) -> None:
    """Resume-failed from a filtered list shows a confirmation with the filter and count,
    changing nothing until confirmed; confirming resumes exactly the filter's failed instances
    (not one outside it), which then complete."""
    ids = [f"bulk-{n}" for n in range(3)]
    for n, instance_id in enumerate(ids):
        assert isinstance(engine.invoke("flaky", n, instance_id=instance_id).wait(WAIT), Failed)
    driver.get(actions_url + "/instances?workflow=flaky&status=failed&id=bulk-")
    assert sorted(a.text for a in driver.find_elements(By.CSS_SELECTOR, ".instance-link")) \
        == ids
    click(driver, "#resume-failed")

    assert query(driver) == {"workflow": ["flaky"], "id": ["bulk-"]}
    assert text(driver, "#confirm-workflow") == "flaky"
    assert text(driver, "#confirm-id") == "bulk-"
    assert text(driver, "#confirm-count").startswith("This resumes 3 failed instances")
    assert text(driver, "#confirm") == "Resume 3 instances"
    assert all(status_of(engine, "flaky", i) == "failed" for i in ids)  # not yet
    screenshot(driver, "dashboard-confirm.png")
    click(driver, "#confirm")

    assert text(driver, "h1") == "Resumed 3 instances"
    links = driver.find_elements(By.CSS_SELECTOR, "#resumed a")
    assert sorted(a.text for a in links) == [f"flaky / {i}" for i in ids]
    assert status_of(engine, "flaky", "flaky-1") == "failed"  # outside the filter
    click(driver, "#resumed a[href$='id=bulk-1']")
    assert text(driver, "#instance-id") == "bulk-1"
    wait_ended(driver, "completed")
    assert text(driver, "#output") == "2"
    wait(driver).until(lambda _: all(status_of(engine, "flaky", i) == "completed"
                                     for i in ids))


def test_pause_and_resume_a_queue(
    driver: WebDriver, actions_url: str, readonly_url: str, engine: Engine
) -> None:
    """The overview's Pause stores the queue paused (an instance invoked meanwhile waits);
    its Resume lets it run; the read-only dashboard shows the column and no form."""
    def row() -> list[str]:
        [queue] = driver.find_elements(By.CSS_SELECTOR, "#queues tbody tr")
        return [td.text for td in queue.find_elements(By.TAG_NAME, "td")]

    driver.get(actions_url + "/")
    assert row()[6:] == ["no", "Pause"]
    click(driver, "form.queue-action[data-queue='mail'] button")
    assert posted("/queue/pause")["queue"] == ["mail"]
    assert query(driver) == {"done": ["pause-queue"]}
    assert text(driver, "#done").startswith("Queue paused")
    assert row()[6].startswith("paused since ")
    assert row()[7] == "Resume"
    assert list(store_of(engine).paused_queues()) == ["mail"]
    waiting = engine.invoke("notify", "bob@example.org", instance_id="paused-1")

    driver.get(readonly_url + "/")
    assert row()[6].startswith("paused since ")
    assert len(row()) == 7
    assert driver.find_elements(By.TAG_NAME, "form") == []

    driver.get(actions_url + "/")
    click(driver, "form.queue-action[data-queue='mail'] button")
    assert posted("/queue/resume")["queue"] == ["mail"]
    assert text(driver, "#done").startswith("Queue resumed")
    assert row()[6:] == ["no", "Pause"]
    assert waiting.result(WAIT) == "sent to bob@example.org"
    assert store_of(engine).paused_queues() == {}


def test_post_without_the_browsers_csrf_token_is_refused(
    driver: WebDriver, actions_url: str, engine: Engine
) -> None:
    """A cancel POST made from the page without a CSRF token, or with a forged one, gets the 403
    page naming the CSRF token, and the instance stays suspended."""
    engine.invoke("approval", 8, instance_id="csrf-1").wait(WAIT)
    driver.get(detail(actions_url, "approval", "csrf-1"))
    for fields in ({"workflow": "approval", "id": "csrf-1"},
                   {"csrf": "forged", "workflow": "approval", "id": "csrf-1"}):
        inject_post(driver, "/instance/cancel", fields)
        assert text(driver, "h1") == "403"
        assert "CSRF token" in text(driver, "#error")
    assert status_of(engine, "approval", "csrf-1") == "suspended"


# ---------------------------------------------------------------------- read-only


def test_read_only_shows_no_forms_and_refuses_posts(
    driver: WebDriver, readonly_url: str, engine: Engine
) -> None:
    """The read-only dashboard shows no action form on any page (the list's filter form only)
    and no resume-failed link; the confirmation page and every POST made from the browser get
    the 403 read-only page, changing nothing."""
    engine.invoke("approval", 6, instance_id="readonly-1").wait(WAIT)
    driver.get(detail(readonly_url, "approval", "readonly-1"))
    assert text(driver, "#mode") == "read-only"
    assert text(driver, "#status") == "suspended"
    assert driver.find_elements(By.TAG_NAME, "form") == []
    for absent in ("actions", "signal-send", "cancel", "resume", "fork"):
        assert driver.find_elements(By.ID, absent) == []

    driver.get(detail(readonly_url, "flaky", "flaky-1"))
    assert text(driver, "#status") == "failed"
    assert driver.find_elements(By.TAG_NAME, "form") == []

    driver.get(readonly_url + "/instances?workflow=flaky&status=failed")
    assert driver.find_elements(By.CSS_SELECTOR, ".instance-link")
    assert driver.find_elements(By.ID, "resume-failed") == []
    assert [f.get_attribute("id") for f in driver.find_elements(By.TAG_NAME, "form")] \
        == ["filter"]  # the filter's GET form only

    driver.get(readonly_url + "/resume-failed?workflow=flaky")
    assert text(driver, "h1") == "403"
    assert driver.find_elements(By.ID, "confirm") == []

    # A POST the page does not offer, made from the browser, gets the 403 page.
    driver.get(detail(readonly_url, "approval", "readonly-1"))
    for action, fields in (
        ("/instance/cancel", {"workflow": "approval", "id": "readonly-1"}),
        ("/instance/signal", {"workflow": "approval", "id": "readonly-1",
                              "key": "approve:v1", "payload": "true"}),
        ("/resume-failed", {"workflow": "flaky", "until": "2100-01-01T00:00:00+00:00"}),
    ):
        inject_post(driver, action, fields)
        assert text(driver, "h1") == "403", action
        assert "This dashboard is read-only" in text(driver, "#error")
        driver.get(detail(readonly_url, "approval", "readonly-1"))
    assert text(driver, "#status") == "suspended"
    assert status_of(engine, "approval", "readonly-1") == "suspended"
    assert status_of(engine, "flaky", "flaky-1") == "failed"


# ---------------------------------------------------------------------- escaping


def test_stored_markup_shows_as_text(driver: WebDriver, actions_url: str) -> None:
    """Markup stored in every field of an instance (id, status message, input, output, step
    keys, error, result) shows as text in the detail page, its form attributes, the list, the
    filter field and the 404 page, and no stored script runs."""
    driver.get(detail(actions_url, "hostile", XSS_ID))
    assert text(driver, "#instance-id") == XSS_ID
    assert text(driver, "#status") == "completed"
    assert text(driver, "#status-message") == f"status {XSS}"
    assert text(driver, "#input") == json.dumps(f"input {XSS}")
    assert text(driver, "#output") == json.dumps({"out": f"output {XSS}"}, indent=1)
    keys = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#steps td.key")]
    assert keys == [f"key {XSS}", f"failing {XSS}"]
    assert text(driver, "#steps summary.error") == f"ValueError: error {XSS}"
    assert text(driver, "#steps code") == json.dumps(f"result {XSS}")
    # Attributes too: the forms' hidden fields and the fork's choices hold the raw text.
    assert {i.get_attribute("value") for i in
            driver.find_elements(By.CSS_SELECTOR, "form input[name=id]")} == {XSS_ID}
    assert [o.text for o in Select(driver.find_element(By.ID, "fork-from")).options][:2] \
        == keys
    no_script_ran(driver)

    driver.get(actions_url + "/instances?" + urlencode({"id": XSS_ID}))
    assert driver.find_element(By.ID, "filter-id").get_attribute("value") == XSS_ID
    [row] = driver.find_elements(By.CSS_SELECTOR, "#instances tbody tr")
    assert row.find_element(By.CSS_SELECTOR, ".instance-link").text == XSS_ID
    assert f"status {XSS}" in row.text
    no_script_ran(driver)

    click(driver, ".instance-link")
    assert text(driver, "#instance-id") == XSS_ID
    no_script_ran(driver)

    driver.get(detail(actions_url, "hostile", f"missing {XSS}"))
    assert text(driver, "h1") == "404"
    assert f"missing {XSS}" in text(driver, "#error")
    no_script_ran(driver)
