"""Screenshot of ``lmforge serve``'s ``/docs`` rendered by headless Chromium with every outside host unreachable.

It shows that the API page needs no internet: Swagger UI's files come from the server itself
(``lmforge.serve.docs``). Run from the repository root::

    python docs/make_serve_screenshot.py --model runs/topics              # any folder lmforge serve accepts
    python docs/make_serve_screenshot.py --toy                             # a toy classifier, fine-tuned first

Writes docs/images/serve-docs.png (``--out``). Chromium is ``/usr/bin/chromium`` or ``--chromium PATH``; its host
resolver maps every name to nothing except the loopback address, so a page that needed a CDN would render blank.
"""

from __future__ import annotations

import argparse
import io
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 200 * 1024


def toy_classifier(folder: Path) -> Path:
    """A tiny sequence classifier fine-tuned on the toy data of the test suite (seconds on a CPU)."""
    sys.path.insert(0, str(ROOT))
    from tests.toy_tasks import make_encoder_dir, write_task_data

    from lmforge.cli import main

    encoder = make_encoder_dir(folder / "encoder")
    train, dev = write_task_data(folder, "sequence")
    out = folder / "topics"
    code = main(["-q", "finetune", "--task", "sequence", "--model", str(encoder), "--train", str(train), "--dev",
                 str(dev), "--out", str(out), "--epochs", "2", "--batch-size", "8", "--max-length", "32"])
    if code != 0:
        raise SystemExit(f"fine-tuning the toy classifier failed (exit {code})")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, server: subprocess.Popen, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"lmforge serve exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"lmforge serve did not answer {url}/health within {seconds:.0f} s")


def shrink(png: Path) -> None:
    """Keep the PNG under MAX_BYTES: a 256-colour palette (text and flat colours survive it unharmed)."""
    if png.stat().st_size <= MAX_BYTES:
        return
    from PIL import Image

    image = Image.open(png).convert("RGB").quantize(colors=256)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    png.write_bytes(buffer.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a model folder that lmforge serve accepts")
    source.add_argument("--toy", action="store_true", help="fine-tune a toy classifier first and serve it")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "serve-docs.png",
                        help="the PNG to write (default: docs/images/serve-docs.png)")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium binary")
    parser.add_argument("--window-size", default="1280,1500", help="width,height of the page in pixels")
    parser.add_argument("--expand", default="classify_classify_post", metavar="OPERATION_ID",
                        help="the endpoint shown open (Swagger UI's deep link; '' for none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or toy_classifier(Path(tmp))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([sys.executable, "-m", "lmforge", "serve", "--model", str(model), "--port",
                                   str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_until_up(url, server)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            # no network: every host name fails to resolve, except the loopback address we serve on
                            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                            "--virtual-time-budget=10000", f"--window-size={args.window_size}",
                            f"--screenshot={args.out}",
                            f"{url}/docs" + (f"#/default/{args.expand}" if args.expand else "")],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        finally:
            server.terminate()
            server.wait(timeout=30)
    shrink(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
