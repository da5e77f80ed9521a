"""Render an HTML file in headless Chromium and report what the engine laid out.

    python tests/chromium_render.py PAGE.html SHOT.png

prints one JSON object: ``engine`` (the user agent), ``loaded``, ``console`` (the page's
console messages), ``requests`` (every URL the page asked for, the page's own file
included), ``text`` (the page's text, ``<title>`` tooltips of its SVGs included), ``zoomed``
(a timeline's time range before and after a wheel turn over it, where the page has one), ``svgs`` (the rendered width and height of each ``<svg>``), ``polylines``,
``height`` and ``width`` (the document's, scrolled: a width over the view's means the
page overflows sideways), and ``ink`` (the fraction of the screenshot's pixels that are
not the background). The whole page is saved to SHOT.png.

The engine is Chromium as Qt WebEngine embeds it (PyPI's ``PyQt6-WebEngine``: Blink and V8,
Chromium 140 in 6.11), drawn offscreen; a test runs this in a subprocess so that a crash of
the engine fails that test and nothing else. Where Debian's ``chromium`` package is installed
the test uses that binary instead (``--headless --screenshot``)."""

import json
import os
import sys

# As root, Chromium's sandbox cannot start; offscreen, no display is needed.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["QTWEBENGINE_CHROMIUM_FLAGS"] = (
    os.environ.get("QTWEBENGINE_CHROMIUM_FLAGS", "") + " --no-sandbox --disable-gpu").strip()
os.environ.setdefault("QTWEBENGINE_DISABLE_SANDBOX", "1")

from PyQt6.QtCore import QTimer, QUrl  # noqa: E402
from PyQt6.QtWebEngineCore import QWebEnginePage, QWebEngineUrlRequestInterceptor  # noqa: E402
from PyQt6.QtWebEngineWidgets import QWebEngineView  # noqa: E402
from PyQt6.QtWidgets import QApplication  # noqa: E402

WIDTH = 1100
PROBE = """(() => ({
  engine: navigator.userAgent,
  svgs: [...document.querySelectorAll('svg')].map(s => {
    const r = s.getBoundingClientRect(); return [r.width, r.height]; }),
  polylines: document.querySelectorAll('polyline').length,
  height: Math.ceil(document.documentElement.scrollHeight),
  width: Math.ceil(document.documentElement.scrollWidth),
  text: document.body.textContent,
  zoomed: (() => { const el = document.querySelector('svg.tl'); if (!el) return null;
    const before = [el._x0, el._x1]; const r = el.getBoundingClientRect();
    el.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width / 2,
      clientY: r.top + 10, bubbles: true, cancelable: true}));
    const after = [el._x0, el._x1];
    el.dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
    return [before, after]; })(),
}))()"""


class Requests(QWebEngineUrlRequestInterceptor):
    """Records every URL the page asks for."""

    def __init__(self):
        super().__init__()
        self.urls = []

    def interceptRequest(self, info):  # noqa: N802 (Qt's name)
        self.urls.append(info.requestUrl().toString())


class Page(QWebEnginePage):
    """Keeps the page's console messages (a script error would show there)."""

    def __init__(self, view):
        super().__init__(view)
        self.console = []

    def javaScriptConsoleMessage(self, level, message, line, source):  # noqa: N802 (Qt's name)
        self.console.append(f"{level.name}: {message} ({source}:{line})")


def ink(image):
    """The fraction of pixels that differ from the top-left one (the background)."""
    bg = image.pixel(0, 0)
    step = 4  # every 4th pixel of every 4th row is plenty to tell a blank page
    seen = hit = 0
    for y in range(0, image.height(), step):
        for x in range(0, image.width(), step):
            seen += 1
            hit += image.pixel(x, y) != bg
    return hit / max(seen, 1)


def main(page_path, shot_path):
    app = QApplication([sys.argv[0]])
    view = QWebEngineView()
    page = Page(view)
    view.setPage(page)
    requests = Requests()
    page.profile().setUrlRequestInterceptor(requests)
    view.resize(WIDTH, 900)
    out = {"loaded": False}

    def finish(result):
        out.update(result or {})
        out["console"] = page.console
        out["requests"] = requests.urls
        image = view.grab().toImage()
        image.save(shot_path)
        out["ink"] = ink(image)
        app.quit()

    def measured(result):
        # the whole document in one shot: the view grows to its height, then is drawn
        height = max(int((result or {}).get("height", 900)), 300)
        view.resize(WIDTH, height)
        # drawn offscreen with no GPU, a tall page takes longer: a 5,900 px one (three
        # devices) was still blank below the first screen after 0.7 s, whole after 3 s
        QTimer.singleShot(700 + height // 2, lambda: page.runJavaScript(PROBE, finish))

    def loaded(ok):
        out["loaded"] = ok
        if not ok:
            app.quit()
            return
        page.runJavaScript(PROBE, measured)

    view.loadFinished.connect(loaded)
    view.load(QUrl.fromLocalFile(os.path.abspath(page_path)))
    view.show()
    QTimer.singleShot(60_000, app.quit)  # a hung engine ends the run; the caller sees it
    app.exec()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
