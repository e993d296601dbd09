"""The viewer in a real browser: a short CPU training streams its renders to headless Chromium.

ns-train runs with nerfstudio's viewer on a loopback port; Chromium (Debian's `chromium` package, which
`make test` installs) opens the page, and the test takes screenshots through the DevTools protocol until
the 3D view shows the rendered scene instead of viser's empty background. The last screenshot is kept in
the test's tmp_path.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from websockets.sync.client import connect

from bytesplat_ns.demo import ns_tool
from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene

pytestmark = pytest.mark.slow

SCENE = DemoSceneConfig(width=64, height=48, num_train=8, num_eval=2, num_points=800, seed=1)
HOST = "127.0.0.1"
TRAIN_LOG, BROWSER_LOG = "ns-train.log", "chromium.log"
VIEWER_READY_LINE = "Viewer running locally at:"
VIEWER_START_TIMEOUT_S = 80.0
"""From launching ns-train to viser serving the page (imports and data loading on 2 CPU cores)."""
BROWSER_START_TIMEOUT_S = 20.0
SCENE_DRAWN_TIMEOUT_S = 60.0
"""From opening the page until a screenshot shows the scene."""
SCREENSHOT_INTERVAL_S = 2.0
CDP_ANSWER_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
"""SIGTERM lets the trainer finish its step and save; after this long it is killed."""

WINDOW = (1000, 700)
SCENE_REGION = (slice(60, 640), slice(0, 660))
"""Rows and columns of the 3D view at WINDOW: below the title bar, left of the control panel, above the
axes widget in the bottom-left corner."""
VISER_BACKGROUND = np.array([20, 20, 20])
"""The 3D view's colour (dark theme) before any render arrives."""
COLOUR_TOLERANCE = 8
"""Largest per-channel difference that still counts as the same colour (PNG and antialiasing noise)."""
MIN_COVERED_FRACTION = 0.5
"""The streamed render fills the 3D view: at least this much of it must differ from viser's background.
Without a render only the transform gizmo and the camera icons differ (about 1%)."""
MIN_DETAIL_FRACTION = 0.02
"""The render shows objects, not a flat fill: at least this much of the view differs from its most common
colour (the scene's background)."""

CHROMIUM_FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader", "--use-angle=swiftshader",
    f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars", "--mute-audio",
    # The test machines have no network; keep Chromium from trying to reach Google's services.
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
    "--disable-quic", "--disable-default-apps", "--no-default-browser-check",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group proc leads; SIGKILL if it is still running after STOP_TIMEOUT_S."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def wait_for(what: str, deadline: float, log: Path, proc: subprocess.Popen, ready):
    """Poll ready() until it returns something truthy; fail if proc exits or the deadline passes."""
    while time.monotonic() < deadline:
        result = ready()
        if result:
            return result
        if proc.poll() is not None:
            pytest.fail(f"{what}: the process exited {proc.returncode} first; its log ({log}):\n{tail(log)}")
        time.sleep(0.5)
    pytest.fail(f"{what}: not ready after the timeout; log ({log}):\n{tail(log)}")


@pytest.fixture
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("Chromium is not installed: run `make test`, which installs Debian's chromium package.")
    return path


@pytest.fixture
def viewer_url(tmp_path):
    """A CPU training with the viewer on a free loopback port; yields the viewer's address."""
    scene = generate_demo_scene(tmp_path / "scene", SCENE)
    port = free_port()
    log = tmp_path / TRAIN_LOG
    args = [
        ns_tool("ns-train"), "bytesplat", "--data", str(scene), "--machine.device-type", "cpu",
        "--max-num-iterations", "100000", "--output-dir", str(tmp_path / "out"), "--vis", "viewer",
        "--viewer.websocket-host", HOST, "--viewer.websocket-port", str(port),
        "--pipeline.model.num-downscales", "0",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + VIEWER_START_TIMEOUT_S
        wait_for("ns-train's viewer", deadline, log, proc, lambda: VIEWER_READY_LINE in tail(log, 10**6))
        yield f"http://{HOST}:{port}/"
    finally:
        stop(proc)


class DevTools:
    """Commands to one Chromium page over its DevTools websocket."""

    def __init__(self, ws):
        self.ws, self.last_id = ws, 0

    def call(self, method: str, **params) -> dict:
        self.last_id += 1
        self.ws.send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        while True:  # skip events until the answer to this command
            message = json.loads(self.ws.recv(timeout=CDP_ANSWER_TIMEOUT_S))
            if message.get("id") == self.last_id:
                break
        if "error" in message:
            raise AssertionError(f"DevTools {method} failed: {message['error']}")
        return message["result"]

    def screenshot(self) -> np.ndarray:
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


@pytest.fixture
def page(chromium, viewer_url, tmp_path):
    """Headless Chromium showing the viewer; yields the page's DevTools connection."""
    profile, log = tmp_path / "chromium-profile", tmp_path / BROWSER_LOG
    with log.open("w") as out:
        proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", viewer_url], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + BROWSER_START_TIMEOUT_S
        port_file = profile / "DevToolsActivePort"  # Chromium writes the port it chose here
        wait_for("Chromium's DevTools port", deadline, log, proc, lambda: port_file.exists() and port_file.read_text())
        devtools_port = port_file.read_text().split()[0]

        def page_address() -> str | None:
            with urllib.request.urlopen(f"http://{HOST}:{devtools_port}/json/list", timeout=5) as response:
                targets = json.load(response)
            return next((t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"), None)

        address = wait_for("Chromium's page", deadline, log, proc, page_address)
        with connect(address, max_size=None, open_timeout=BROWSER_START_TIMEOUT_S) as ws:
            devtools = DevTools(ws)
            # Headless Chromium's --window-size includes an invisible browser frame; fix the page's own size.
            devtools.call("Emulation.setDeviceMetricsOverride", width=WINDOW[0], height=WINDOW[1],
                          deviceScaleFactor=1, mobile=False)  # fmt: skip
            yield devtools
    finally:
        stop(proc)


def scene_drawn(shot: np.ndarray) -> tuple[bool, str]:
    """Whether the 3D view shows a streamed render; also a line describing what was measured."""
    view = shot[SCENE_REGION].astype(int).reshape(-1, 3)
    covered = (np.abs(view - VISER_BACKGROUND).max(axis=1) > COLOUR_TOLERANCE).mean()
    colours, counts = np.unique(view, axis=0, return_counts=True)
    detail = (np.abs(view - colours[counts.argmax()]).max(axis=1) > COLOUR_TOLERANCE).mean()
    summary = (f"{covered:.1%} of the 3D view differs from viser's background (need {MIN_COVERED_FRACTION:.0%}), "
               f"{detail:.1%} from its most common colour (need {MIN_DETAIL_FRACTION:.0%})")  # fmt: skip
    return covered >= MIN_COVERED_FRACTION and detail >= MIN_DETAIL_FRACTION, summary


def test_viewer_draws_scene_in_chromium(page, viewer_url, tmp_path):
    shot_path = tmp_path / "viewer.png"
    deadline = time.monotonic() + SCENE_DRAWN_TIMEOUT_S
    shots, drawn = 0, False
    while not drawn and time.monotonic() < deadline:
        time.sleep(SCREENSHOT_INTERVAL_S)
        shot = page.screenshot()
        shots += 1
        drawn, summary = scene_drawn(shot)
    Image.fromarray(shot).save(shot_path)
    assert shot.shape[:2] == (WINDOW[1], WINDOW[0]), f"screenshot {shot_path} is {shot.shape}"
    assert drawn, (f"after {shots} screenshots the viewer at {viewer_url} shows no scene: {summary}; last "
                   f"screenshot: {shot_path}; logs: {tmp_path / TRAIN_LOG}, {tmp_path / BROWSER_LOG}")  # fmt: skip
    print(f"scene drawn after {shots} screenshots ({summary}); screenshot: {shot_path}")
