"""Headless Chromium over the DevTools protocol on a pipe (``--remote-debugging-pipe``), standard library only.

Chromium reads commands from fd 3 and writes replies and events to fd 4, each a JSON message ending in a NUL byte.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--remote-debugging-pipe")
WIDTH, HEIGHT = 1280, 900  # viewport (CSS pixels)
TIMEOUT_S = 60.0

# What a page check collects: every <img>, links to ids the page lacks, the verdict, the page text, overflow.
PAGE_PROBE = """JSON.stringify({
  images: Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth,
                                               naturalHeight: i.naturalHeight, scheme: i.src.split(':')[0]})),
  brokenAnchors: Array.from(document.querySelectorAll('a[href^="#"]'))
                  .map(a => a.getAttribute('href').slice(1)).filter(id => !document.getElementById(id)),
  verdicts: Array.from(document.querySelectorAll('.verdict-text')).map(e => e.textContent),
  text: document.body.innerText,
  scrollWidth: document.documentElement.scrollWidth,
  innerWidth: window.innerWidth,
})"""


def find_chromium() -> str | None:
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    return None


class DevToolsError(RuntimeError):
    pass


class Chromium:
    """One headless browser; ``check_page`` opens a file in a fresh tab and reports what a person would see."""

    def __init__(self, binary: str):
        self.profile = tempfile.mkdtemp(prefix="poolsim-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # move the child's ends above fd 9 so dup2 onto 3 and 4 cannot clobber one of them
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)

        def wire_pipes():  # NOTE: runs in the child before exec; subprocess cannot renumber fds itself
            os.dup2(child_r, 3)  # dup2 clears close-on-exec on the new fds
            os.dup2(child_w, 4)

        self.log = Path(self.profile) / "chromium.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [binary, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=wire_pipes,  # noqa: PLW1509
                close_fds=False)
        os.close(child_r)
        os.close(child_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.send("Browser.getVersion")

    # ---------------------------------------------------------------- protocol
    def send(self, method: str, session: str | None = None, **params) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            event = self._read()
            if event.get("method") == method and event.get("sessionId") == session:
                return event
            self.events.append(event)

    def _read(self) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._from_browser], [], [], max(left, 0))
            if not ready:
                raise DevToolsError(f"no DevTools message from Chromium in {TIMEOUT_S:.0f} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                err = self.log.read_text(errors="replace").strip().splitlines()
                raise DevToolsError("Chromium closed the DevTools pipe" + (f": {err[-1]}" if err else ""))
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    # ---------------------------------------------------------------- a page, as a person sees it
    def check_page(self, page: Path, screenshot: Path) -> dict:
        """Load ``page``; return the probe's findings plus ``console_errors`` and ``requests`` (URLs fetched),
        and write a full-page PNG screenshot."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session)
        self.send("Emulation.setDeviceMetricsOverride", session, width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                  mobile=False)
        self.events = [e for e in self.events if e.get("sessionId") != session]
        self.send("Page.navigate", session, url=page.resolve().as_uri())
        self.wait_for("Page.loadEventFired", session)
        probe = self.send("Runtime.evaluate", session, expression=PAGE_PROBE, returnByValue=True)
        found = json.loads(probe["result"]["value"])
        height = int(self.send("Page.getLayoutMetrics", session)["cssContentSize"]["height"])
        self.send("Emulation.setDeviceMetricsOverride", session, width=WIDTH, height=height, deviceScaleFactor=1,
                  mobile=False)
        shot = self.send("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        mine = [e for e in self.events if e.get("sessionId") == session]
        found["console_errors"] = _errors(mine)
        found["requests"] = [e["params"]["request"]["url"][:80] for e in mine
                             if e.get("method") == "Network.requestWillBeSent"]
        found["page_height"] = height
        self.send("Target.closeTarget", targetId=target)
        self.events = [e for e in self.events if e.get("sessionId") != session]
        return found

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (DevToolsError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


def _errors(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions, and failed loads, as one line each."""
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = p["exceptionDetails"]
            what = details.get("exception", {}).get("description") or details.get("text", "")
            out.append("exception: " + what.splitlines()[0])
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", "")) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append("log: " + p["entry"].get("text", ""))
        elif method == "Network.loadingFailed":
            out.append("load failed: " + p.get("errorText", ""))
    return out
