"""`nmt serve`'s page in a real browser: headless Chromium (`scripts/browser.py`, driven
over the DevTools protocol) types a sentence into the page served with the tiny model; the
page must show the API's translation and draw its attention heatmap, and the screenshot must
show it.

Skipped where Chromium is absent: `make install-browser` installs Debian's package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from browser import BROWSER, Chromium, type_into_page  # noqa: E402
from load_test import running_server  # noqa: E402

pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="headless Chromium not installed (make install-browser)"
)


def test_the_page_translates_what_is_typed_and_draws_the_attention(tiny_run, tmp_path):
    sentence = tiny_run.train_src[0]
    with running_server(str(tiny_run.run_dir), "--device", "cpu") as server:
        expected = httpx.post(
            f"{server.url}/translate", json={"text": sentence, "beam": 5, "attention": True}
        ).json()["translations"][0]
        browser = Chromium(tmp_path / "profile")
        try:
            shown = type_into_page(browser, server.url, sentence)
        finally:
            browser.close()
    assert shown["translation"] == expected["text"]
    assert shown["rows"] == len(expected["attention"]["target"])
    assert shown["columns"] == len(expected["attention"]["source"]) + 1  # and the corner
    png = tmp_path / "page.png"
    png.write_bytes(shown["png"])
    from matplotlib.image import imread

    pixels = imread(png)[..., :3]  # (height, width, 3) in [0, 1]
    # The heatmap's cells are shades of one blue over white: clearly bluer than red.
    blue = (pixels[..., 2] - pixels[..., 0] > 0.15).sum()
    assert blue > 20 * 20, f"no heatmap in the screenshot ({blue} blue pixels): {png}"
