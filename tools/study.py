"""Serve the built book on 127.0.0.1 and start JupyterLab on the repository; print both URLs.

Both servers listen on the loopback interface only. JupyterLab gets a fresh random token each
run (the printed URL carries it). Ctrl-C stops both.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request

from tools.notebooks import ROOT


def wait_for(url: str, seconds: float = 60) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return True
        except Exception:  # noqa: BLE001 - any failure means "not up yet"
            time.sleep(0.5)
    return False


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="./book study")
    ap.add_argument("--book-port", type=int, default=8000)
    ap.add_argument("--lab-port", type=int, default=8888)
    args = ap.parse_args(argv)
    html = ROOT / "_build" / "html"
    token = secrets.token_hex(16)
    book = subprocess.Popen([sys.executable, "-m", "http.server", str(args.book_port), "--bind", "127.0.0.1",
                             "--directory", str(html)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lab_cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1",
               f"--port={args.lab_port}", "--port-retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={ROOT}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        lab_cmd.append("--allow-root")
    lab = subprocess.Popen(lab_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    book_url = f"http://127.0.0.1:{args.book_port}/intro.html"
    lab_url = f"http://127.0.0.1:{args.lab_port}/lab?token={token}"
    ok = wait_for(book_url) and wait_for(f"http://127.0.0.1:{args.lab_port}/api/status?token={token}")
    if not ok:
        for p in (book, lab):
            p.terminate()
        err = lab.stderr.read().decode(errors="replace")[-2000:] if lab.stderr else ""
        print(f"a server did not start (ports {args.book_port}/{args.lab_port} busy?)\n{err}", file=sys.stderr)
        return 1
    print(f"\n  Book (static, offline):    {book_url}\n  JupyterLab (live widgets): {lab_url}\n"
          "\n  Ctrl-C stops both.\n", flush=True)

    def stop(*_):
        for p in (book, lab):
            p.terminate()
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while book.poll() is None and lab.poll() is None:
        time.sleep(1)
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
