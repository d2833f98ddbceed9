"""Headless Chromium driven over the DevTools protocol, for `nmt serve`'s page.

Chromium's `--remote-debugging-pipe` speaks the protocol as JSON messages on file
descriptors 3 and 4: no driver or websocket library to install. tests/test_page.py uses it
to type into the page; run as a script, it takes the README's screenshot:

    .venv/bin/python scripts/browser.py --model runs/latest --text "Helga ate an apple." \
        --out docs/serve_page.png
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_test import running_server  # noqa: E402

from nmt.errors import one_line  # noqa: E402
from nmt.files import check_output, write_output  # noqa: E402

BROWSER = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)


def _above_9(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Chromium:
    """A headless browser and one page, spoken to over the DevTools pipe."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1000, 900)) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's ends above fd 9, so that moving one to fd 3 or 4 never overwrites the other.
        to_browser_r, from_browser_w = (_above_9(fd) for fd in (to_browser_r, from_browser_w))
        assert BROWSER is not None
        flags = [
            "--headless=new",
            "--remote-debugging-pipe",
            "--no-sandbox",  # as root in a container
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            "about:blank",
        ]
        # The protocol reads commands on fd 3 and writes replies on fd 4: a Python trampoline
        # moves our pipe ends there (Popen keeps fds but cannot renumber them, and dash cannot
        # name fds above 9), then becomes the browser.
        trampoline = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                trampoline,
                str(to_browser_r),
                str(from_browser_w),
                BROWSER,
                *flags,
            ],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, *, page: bool = False, **params: Any) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if page:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", page=True, expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"the page never satisfied {expression}")

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):  # it may be gone already
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=20)
        finally:
            self.proc.kill()
            os.close(self._to_browser)
            os.close(self._from_browser)


def type_into_page(browser: Chromium, url: str, text: str) -> dict[str, Any]:
    """Open the page, type `text`, wait for its translation; what the page shows."""
    browser.call("Page.enable", page=True)
    browser.call("Page.navigate", page=True, url=f"{url}/")
    browser.wait_for("document.readyState === 'complete'")
    browser.evaluate("document.getElementById('source').focus()")
    browser.call("Input.insertText", page=True, text=text)  # as if typed
    shown = browser.wait_for("document.querySelector('.translation')?.textContent")
    browser.wait_for("document.getElementById('status').textContent.includes('ms')")
    return {
        "translation": shown,
        "rows": browser.evaluate("document.querySelectorAll('table.heat tbody tr').length"),
        "columns": browser.evaluate("document.querySelectorAll('table.heat thead th').length"),
        "png": base64.b64decode(
            browser.call("Page.captureScreenshot", page=True, format="png")["data"]
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="runs/latest")
    ap.add_argument("--text", default="Helga ate an apple.")
    ap.add_argument("--out", type=Path, default=Path("docs/serve_page.png"))
    ap.add_argument("--size", default="900,880", help="window width,height")
    args = ap.parse_args()
    check_output(args.out, "--out")  # before anything starts
    if BROWSER is None:
        sys.exit("no chromium on PATH: make install-browser")
    width, height = (int(x) for x in args.size.split(","))
    with running_server(args.model) as server, tempfile.TemporaryDirectory() as profile:
        browser = Chromium(Path(profile), (width, height))
        try:
            shown = type_into_page(browser, server.url, args.text)
        finally:
            browser.close()
    write_output(args.out, shown["png"])
    print(f"{args.out}: {shown['translation']!r}")


if __name__ == "__main__":
    with one_line():
        main()
