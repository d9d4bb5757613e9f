"""xf serve's page (GET /), used as a person uses it, in a real headless chromium: typing, translating
(Ctrl+Enter too), a paragraph of several lines all back beside it, an alternative picked, the swap,
copy, the character count against --max-chars, the busy state, an error in place, a glossary typed
(its bad lines marked, kept over a reload, the server's own glossary turned off); and on a server
with the defaults, nothing offered that it refuses. What the page shows is compared with what the
API answers for the same text: the page adds nothing and loses nothing. Screenshots at desktop and
phone widths are saved for a person to look at (their directory is printed), not compared.
GET /frontend/settings, what the page asks first, has a fast in-process test."""

from __future__ import annotations

import asyncio
import shutil

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from helpers import FakeEngine, FakeSp, Served, call, until  # noqa: E402  a server process; the app in-process
from xformer_cli.settings.config import build_options  # noqa: E402
from xformer_cli.settings.options import ServeOptions, TranslateOptions  # noqa: E402
from xformer_cli.serve.batch_queue import Direction  # noqa: E402
from xformer_cli.serve.server import Server  # noqa: E402

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
DECODING = ["--max-len-a", "0.5", "--max-len-b", "3", "--threads", "1"]
KEY = "page-test-key"
DESKTOP, PHONE = (1280, 800), (390, 844)


# -- GET /frontend/settings, in-process ------------------------------------------------------------
def settings_of(values: dict, api_keys: list[str]) -> dict:
    options = build_options(ServeOptions, values, "test")
    directions = [Direction(*spec.split("=")[0].split("-"), FakeEngine(), FakeSp(), TranslateOptions(path=("x",)))
                  for spec in values["model"]]
    app = Server(directions, options, api_keys).app()
    status, answer = asyncio.run(call(app, "/frontend/settings", method="GET"))
    assert status == 200
    return answer


def test_settings_say_what_the_server_offers():
    assert settings_of({"model": ["en-de=a.pt", "de-en=b.pt", "en-fr=c.pt"], "nbest": 3, "beam_size": 4,
                        "max_chars": 1234, "max_lines": 7}, ["k"]) == {
        "charLimit": 1234, "lineLimit": 7, "alternativesLimit": 2, "detection": True,  # py3langid: the test extra
        "apiKeys": True, "keyRequired": True,
        "language": {"source": {"code": "en", "name": "English"}, "target": {"code": "de", "name": "German"}},
        "names": {"de": "German", "en": "English", "fr": "French"},
        "glossaries": [], "glossaryLimit": 500, "formality": [],
        "suggestions": False, "filesTranslation": True, "supportedFilesFormat": [".txt"],
    }
    # the defaults: --nbest 1 gives no alternative, no key is asked for; a code without a name is itself
    plain = settings_of({"model": ["xx-de=a.pt"]}, [])
    assert (plain["charLimit"], plain["lineLimit"], plain["alternativesLimit"]) == (5000, 100, 0)
    assert (plain["keyRequired"], plain["names"]) == (False, {"de": "German", "xx": "xx"})
    assert plain["detection"] is False  # no served source language that the identifier knows


def test_settings_take_only_get():
    options = build_options(ServeOptions, {"model": ["en-de=a.pt"]}, "test")
    app = Server([Direction("en", "de", FakeEngine(), FakeSp(), TranslateOptions(path=("x",)))], options, []).app()
    status, answer = asyncio.run(call(app, "/frontend/settings", b"{}"))
    assert status == 405 and "error" in answer


# -- the page in a headless browser ----------------------------------------------------------------
needs_browser = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                   reason="no headless browser: apt-get install chromium chromium-driver (.ci/run does)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the test extra) is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--window-size={DESKTOP[0]},{DESKTOP[1]}", "--lang=en-US", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory, request):
    folder = tmp_path_factory.mktemp("serve-page-screenshots")
    yield folder
    plugins = request.config.pluginmanager
    with plugins.getplugin("capturemanager").global_and_fixture_disabled():  # printed under -q and capture too
        reporter = plugins.getplugin("terminalreporter")
        reporter.write("\n")  # after the progress dots
        for png in sorted(folder.glob("*.png")):
            reporter.write_line(f"xf serve page screenshot: {png}")


@pytest.fixture(scope="module")
def two_way(ckpt, tmp_path_factory):
    """Both directions, two hypotheses a line (one alternative), an API key, a small character limit."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"{KEY}\n", encoding="utf-8")
    served = Served("--model", f"en-de={ckpt}", "--model", f"de-en={ckpt}", "--nbest", "2", "--beam-size", "4",
                    *DECODING, "--max-chars", "900", "--max-lines", "12", "--api-keys", str(keys))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def plain(ckpt):
    """The defaults: one direction, --nbest 1, no key, --max-chars 5000."""
    served = Served("--model", f"en-de={ckpt}", *DECODING)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def multilingual(multi30k_dir, tmp_path_factory):
    """One multilingual model (pairs en-de, en-fr) serving both its directions."""
    from helpers import multilingual_checkpoint

    path = multilingual_checkpoint(tmp_path_factory.mktemp("multi") / "multi.pt", multi30k_dir)
    served = Served("--model", path, *DECODING)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def glossed(ckpt, tmp_path_factory):
    """One direction with a server glossary: 'man' -> Hund."""
    terms = tmp_path_factory.mktemp("glossary") / "terms.tsv"
    terms.write_text("man\tHund\n", encoding="utf-8")
    served = Served("--model", f"en-de={ckpt}", "--glossary", f"en-de={terms}", *DECODING)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def formal(multi30k_dir, tmp_path_factory):
    """One en-de model with formality tags (its vocabulary holds >>formal<< and >>informal<<)."""
    from helpers import learn_spm, random_checkpoint
    from xformer_cli.text.formality_tags import TAGS

    text = [line for lang in ("en", "de") for line in (multi30k_dir / f"train.{lang}").read_text(
        encoding="utf-8").splitlines()[:300]]
    path = random_checkpoint(tmp_path_factory.mktemp("formal") / "formal.pt", learn_spm(text, 200, TAGS.values()),
                             meta={"source_lang": "en", "target_lang": "de", "formality": "de"})
    served = Served("--model", path, *DECODING)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def lines(multi30k_dir) -> list[str]:
    return (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:40]


def by_id(browser, element_id: str):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id)


def text_of(browser, element_id: str) -> str:
    return by_id(browser, element_id).get_property("textContent")


def wait(browser, condition, seconds: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, seconds).until(lambda b: condition())


def open_page(browser, served: Served) -> None:
    browser.get(f"http://127.0.0.1:{served.port}/")
    wait(browser, lambda: browser.find_element("tag name", "body").get_attribute("data-ready"))
    assert browser.find_element("tag name", "body").get_attribute("data-ready") == "true", text_of(browser, "error")


def selected(browser, element_id: str) -> tuple[str, str]:
    """(code, name shown) of a language select."""
    from selenium.webdriver.support.ui import Select

    option = Select(by_id(browser, element_id)).first_selected_option
    return option.get_attribute("value"), option.text


def answered(browser, action) -> str:
    """Run ``action`` (which starts a translation), wait until the page is no longer busy, and return
    the translation shown."""
    browser.execute_script("""
        window.__answered = false;
        const pane = document.getElementById('output-pane');
        new MutationObserver((_, observer) => { if (pane.getAttribute('aria-busy') === 'false') {
            window.__answered = true; observer.disconnect(); } }).observe(pane, { attributes: true });""")
    action()
    wait(browser, lambda: browser.execute_script("return window.__answered"))
    return text_of(browser, "translation")


def translate_and_wait(browser) -> str:
    return answered(browser, by_id(browser, "translate").click)


def type_text(browser, text: str) -> None:
    source = by_id(browser, "source")
    source.clear()
    source.send_keys(text)
    assert source.get_property("value") == text


def shoot(browser, screenshots, name: str, size: tuple[int, int], mobile: bool) -> None:
    width, height = size
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile})
    browser.execute_script("window.scrollTo(0, 0)")
    assert browser.save_screenshot(str(screenshots / f"{name}-{width}x{height}.png"))
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def layout(browser) -> tuple[dict, dict]:
    """The source and translation panes' rectangles."""
    from selenium.webdriver.common.by import By

    source, output = browser.find_elements(By.CSS_SELECTOR, ".pane")
    return source.rect, output.rect


@pytest.mark.slow
@needs_browser
def test_type_translate_pick_an_alternative_copy_and_swap(two_way, browser, lines, screenshots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_page(browser, two_way)
    assert selected(browser, "source-language") == ("en", "English")
    assert selected(browser, "target-language") == ("de", "German")
    assert by_id(browser, "key-row").is_displayed()
    by_id(browser, "api-key").send_keys(KEY)

    text = f"{lines[7]}\n{lines[8]}"
    type_text(browser, text)
    assert text_of(browser, "count") == f"{len(text)} / 900 characters"
    status, _, expected = two_way.translate(text, alternatives=1, api_key=KEY)
    assert status == 200 and len(expected["alternatives"]) == 1
    shown = answered(browser, lambda: by_id(browser, "source").send_keys(Keys.CONTROL + Keys.ENTER))  # the keyboard's way
    assert shown == expected["translatedText"] and shown.count("\n") == 1
    assert text_of(browser, "error") == ""
    choices = browser.find_elements(By.CSS_SELECTOR, "#alternatives-list button")
    assert [c.get_property("textContent") for c in choices] == expected["alternatives"]

    shoot(browser, screenshots, "desktop", DESKTOP, mobile=False)
    shoot(browser, screenshots, "phone", PHONE, mobile=True)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": PHONE[0], "height": PHONE[1], "deviceScaleFactor": 1, "mobile": True})
    (source, output) = layout(browser)
    assert output["y"] >= source["y"] + source["height"]  # a phone: one above the other
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    (source, output) = layout(browser)
    assert output["x"] >= source["x"] + source["width"] and output["y"] == source["y"]  # a desktop: side by side

    choices[0].click()  # the alternative becomes the translation, the translation an alternative
    assert text_of(browser, "translation") == expected["alternatives"][0]
    assert [c.get_property("textContent") for c in browser.find_elements(By.CSS_SELECTOR, "#alternatives-list button")] \
        == [expected["translatedText"]]
    choices = browser.find_elements(By.CSS_SELECTOR, "#alternatives-list button")
    choices[0].click()  # and back
    assert text_of(browser, "translation") == expected["translatedText"]

    by_id(browser, "copy").click()
    wait(browser, lambda: text_of(browser, "status") == "Copied")
    by_id(browser, "source").clear()
    by_id(browser, "source").send_keys(Keys.CONTROL + "v")  # what was copied, pasted back
    assert by_id(browser, "source").get_property("value") == expected["translatedText"]
    type_text(browser, text)

    swap = by_id(browser, "swap")
    assert swap.is_displayed() and swap.is_enabled()
    back = expected["translatedText"]
    status, _, reverse = two_way.translate(back, source="de", target="en", alternatives=1, api_key=KEY)
    assert status == 200
    answered(browser, swap.click)  # the translation becomes the source, translated back
    assert selected(browser, "source-language") == ("de", "German")
    assert selected(browser, "target-language") == ("en", "English")
    assert by_id(browser, "source").get_property("value") == back
    assert text_of(browser, "translation") == reverse["translatedText"]


@pytest.mark.slow
@needs_browser
def test_a_long_text_comes_back_whole_with_its_paragraphs(two_way, browser, lines, screenshots):
    open_page(browser, two_way)
    by_id(browser, "api-key").send_keys(KEY)
    # three paragraphs, one of four lines; the blank lines between them are kept
    text = "\n".join(lines[10:14]) + "\n\n" + "\n".join(lines[14:17]) + "\n\n" + lines[17]
    type_text(browser, text)
    status, _, expected = two_way.translate(text, alternatives=1, api_key=KEY)
    assert status == 200
    shown = translate_and_wait(browser)
    assert shown == expected["translatedText"]
    assert len(shown.split("\n")) == 10 and shown.split("\n")[4] == shown.split("\n")[8] == ""
    shoot(browser, screenshots, "long-desktop", DESKTOP, mobile=False)


@pytest.mark.slow
@needs_browser
def test_busy_errors_and_the_limit_in_place(two_way, browser, lines):
    open_page(browser, two_way)
    type_text(browser, lines[0])

    # busy: the answer is held back (a wrapped fetch) while the page is looked at
    browser.execute_script("""
        const fetched = window.fetch;
        window.__release = null;
        window.fetch = (...args) => new Promise((resolve) => { window.__release = () => {
            window.fetch = fetched;
            resolve(fetched(...args));
        }; });""")
    by_id(browser, "translate").click()
    wait(browser, lambda: browser.execute_script("return window.__release !== null"))
    assert by_id(browser, "output-pane").get_attribute("aria-busy") == "true"
    assert not by_id(browser, "translate").is_enabled() and text_of(browser, "translate") == "Translating\u2026"
    assert text_of(browser, "status") == "Translating\u2026"
    browser.execute_script("window.__release()")

    # no key: the server's refusal, in place, and nothing else shown
    wait(browser, lambda: text_of(browser, "error"))
    assert text_of(browser, "error") == "an API key is needed: send it as 'api_key'"
    assert by_id(browser, "error").get_attribute("role") == "alert"
    assert text_of(browser, "translation") == "" and not by_id(browser, "copy").is_enabled()
    assert by_id(browser, "output-pane").get_attribute("aria-busy") == "false" and by_id(browser, "translate").is_enabled()
    by_id(browser, "api-key").send_keys("wrong")
    translate_and_wait(browser)
    assert text_of(browser, "error") == "Invalid API key"

    by_id(browser, "api-key").clear()
    by_id(browser, "api-key").send_keys(KEY)
    assert translate_and_wait(browser) and text_of(browser, "error") == ""

    # more lines than --max-lines 12: the server's 413, in place of the translation
    type_text(browser, "\n".join(["A dog runs."] * 13))
    assert translate_and_wait(browser) == "" and "(--max-lines)" in text_of(browser, "error")

    # the limit: counted as the server counts (code points), over it the page does not send
    over = "\u00e9\U0001f600 " * 300  # 900 characters, 1200 UTF-16 units
    browser.execute_script("const s = document.getElementById('source'); s.value = arguments[0];"
                           "s.dispatchEvent(new Event('input'));", over)
    assert text_of(browser, "count") == "900 / 900 characters" and by_id(browser, "translate").is_enabled()
    by_id(browser, "source").send_keys("x")
    assert text_of(browser, "count") == "901 / 900 characters: 1 over this server's limit"
    assert "over" in by_id(browser, "count").get_attribute("class") and not by_id(browser, "translate").is_enabled()
    assert by_id(browser, "source").get_attribute("aria-invalid") == "true"


@pytest.mark.slow
@needs_browser
def test_a_plain_server_is_offered_as_it_is(plain, browser, lines):
    open_page(browser, plain)
    assert selected(browser, "source-language") == ("en", "English")
    assert selected(browser, "target-language") == ("de", "German")
    assert not by_id(browser, "swap").is_displayed()  # no direction's reverse is served
    assert not by_id(browser, "key-row").is_displayed()
    assert text_of(browser, "count") == "0 / 5,000 characters"
    type_text(browser, lines[3])
    status, _, expected = plain.translate(lines[3])
    assert status == 200 and translate_and_wait(browser) == expected["translatedText"]
    assert not by_id(browser, "alternatives").is_displayed() and text_of(browser, "error") == ""
    log = [line for line in plain.log.splitlines() if "POST /translate" in line]
    assert all(" 200 " in line for line in log)  # nothing asked that it refuses (alternatives 0)


@pytest.mark.slow
@needs_browser
def test_the_address_is_offered_where_the_model_has_formality_tags(formal, plain, browser, lines):
    from selenium.webdriver.support.ui import Select

    open_page(browser, plain)
    assert not by_id(browser, "formality-row").is_displayed()
    open_page(browser, formal)
    assert by_id(browser, "formality-row").is_displayed()
    browser.execute_script("""
        window.__bodies = [];
        const send = window.fetch;
        window.fetch = (path, init) => { if (path === "translate") window.__bodies.push(JSON.parse(init.body));
                                         return send(path, init); };""")
    type_text(browser, lines[3])
    choose = Select(by_id(browser, "formality")).select_by_value
    choose("informal")
    shown = {"informal": translate_and_wait(browser)}
    shown["formal"] = answered(browser, lambda: choose("formal"))  # a new choice translates again
    shown[""] = answered(browser, lambda: choose(""))
    for choice, text in shown.items():
        status, _, expected = formal.translate(lines[3], **({"formality": choice} if choice else {}))
        assert status == 200 and text == expected["translatedText"] and text_of(browser, "error") == ""
    sent = browser.execute_script("return window.__bodies")
    assert [body.get("formality") for body in sent] == ["informal", "formal", None]


@pytest.mark.slow
@needs_browser
def test_a_multilingual_model_offers_each_target(multilingual, browser, lines):
    from selenium.webdriver.support.ui import Select

    open_page(browser, multilingual)
    assert selected(browser, "source-language") == ("en", "English")
    targets = Select(by_id(browser, "target-language"))
    assert [o.get_attribute("value") for o in targets.options] == ["de", "fr"]
    assert not by_id(browser, "swap").is_displayed()  # nothing translates back into en
    type_text(browser, lines[3])
    for target in ("de", "fr"):
        targets.select_by_value(target)
        status, _, expected = multilingual.translate(lines[3], target=target)
        assert status == 200
        assert translate_and_wait(browser) == expected["translatedText"] and text_of(browser, "error") == ""
    # the page asked for each target chosen (besides the test's own request of each)
    assert until(lambda: all(multilingual.log.count(f"POST /translate 200 | direction en-{t} ") >= 2
                             for t in ("de", "fr")), 5), multilingual.log


@pytest.mark.slow
@needs_browser
def test_keyboard_only(two_way, browser):
    from selenium.webdriver.common.keys import Keys

    open_page(browser, two_way)
    order = ["source-language", "swap", "target-language", "api-key", "source", "translate"]
    browser.execute_script("arguments[0].focus()", by_id(browser, order[0]))
    reached = []
    for _ in order:
        reached.append(browser.switch_to.active_element.get_attribute("id"))
        browser.switch_to.active_element.send_keys(Keys.TAB)
    assert reached == order
    # every control has a name a screen reader says
    for element_id in ("source-language", "target-language", "source", "api-key"):
        assert browser.execute_script("return arguments[0].labels.length", by_id(browser, element_id)) == 1
    assert by_id(browser, "swap").get_attribute("aria-label") == "Swap languages"


@pytest.mark.slow
@needs_browser
def test_a_glossary_typed_is_sent_kept_over_a_reload_and_its_bad_lines_marked(glossed, browser, screenshots):
    from selenium.webdriver.common.by import By

    def problems():
        items = browser.find_elements(By.CSS_SELECTOR, "#glossary-problems li")
        return [item.get_property("textContent") for item in items]

    open_page(browser, glossed)
    server_row = by_id(browser, "server-glossary-row")
    assert server_row.is_displayed() and by_id(browser, "server-glossary").is_selected()
    glossary = by_id(browser, "glossary")
    glossary.clear()
    glossary.send_keys("boy = Baum\nnothing to read here\nBOY = Busch\n")  # typed, as a person does
    browser.execute_script("const g = arguments[0]; g.value += 'girl\\tKatze|Katzen\\n';"  # pasted TSV
                           "g.dispatchEvent(new Event('input'));", glossary)
    assert problems() == ['Line 2 is not used: no "=" (or tab) between the term and its translation',
                          'Line 3 is not used: "BOY" is already on line 1']
    assert glossary.get_attribute("aria-invalid") == "true"

    text = "A man and a boy sleep."
    type_text(browser, text)
    sent = [["boy", ["Baum"]], ["girl", ["Katze", "Katzen"]]]
    status, _, expected = glossed.translate(text, glossary=sent)
    assert status == 200 and [t["source"] for t in expected["glossaryTerms"]] == ["man", "boy"]
    shown = translate_and_wait(browser)
    assert shown == expected["translatedText"] and "Baum" in shown and "Hund" in shown
    assert text_of(browser, "glossary-report").startswith("Glossary terms found: man \u2192 Hund")
    shoot(browser, screenshots, "glossary-desktop", DESKTOP, mobile=False)
    shoot(browser, screenshots, "glossary-phone", PHONE, mobile=True)

    # unticked, the server's own glossary is not applied: the request's terms alone
    by_id(browser, "server-glossary").click()
    status, _, own = glossed.translate(text, glossary=sent, server_glossary=False)
    assert status == 200 and own["translatedText"] != expected["translatedText"]
    assert translate_and_wait(browser) == own["translatedText"]

    # a reload keeps the glossary, its marks and the choice
    browser.refresh()
    open_page(browser, glossed)
    typed = "boy = Baum\nnothing to read here\nBOY = Busch\ngirl\tKatze|Katzen\n"
    assert by_id(browser, "glossary").get_property("value") == typed
    assert len(problems()) == 2 and not by_id(browser, "server-glossary").is_selected()
    type_text(browser, text)
    assert translate_and_wait(browser) == own["translatedText"]
    browser.execute_script("localStorage.clear()")  # the other tests' page has no glossary
