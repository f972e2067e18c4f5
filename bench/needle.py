"""`python -m bench.needle`: a fact buried in a long prompt, asked at the end, answered in words, on 1 and 2 ranks.

A needle sentence ("The secret code is 4417.") sits a third of the way into filler prose; the question comes last.
For each rank count (`--ranks 1,2`; 2 is `mlx.launch --backend ring`, where a model whose heads do not divide
pipelines itself) and each prompt length (`--lengths`, tokens of the chat-templated prompt), one greedy chat
request through our API with the prefix cache off (every prefill is cold): whether the answer contains the code,
the time to its first token (the prefill) and the answer itself.

    python -m bench.needle --model smollm2-135m --cache-dir ~/.cache/mlx-cluster-serve
    python -m bench.needle --model smollm2-135m --lengths 8000 --ranks 2
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench import cpu, servers  # noqa: E402
from bench.run import resolve_model  # noqa: E402

CODE = "4417"
NEEDLE = f"The secret code is {CODE}. "
# an 8k prompt prefills at a few tokens/s on a 2-core CPU (an hour on 2 ranks): the server's default 600 s is short
REQUEST_TIMEOUT = 4 * 3600
QUESTION = "What is the secret code mentioned in the text above? Answer with the number."
# plain prose that mentions no number, so the only code in the prompt is the needle's
FILLER = [
    "The river ran slowly past the old mill, and the miller watched the water turn the wheel. ",
    "In the market the traders called out their prices while children chased each other between the stalls. ",
    "Autumn came early that year, and the leaves on the hills turned red and gold before the first frost. ",
    "The library kept its oldest books in a cool room at the back, where few visitors ever went. ",
    "A fisherman mended his nets on the quay and talked about the weather with anyone who passed. ",
    "The train to the coast left every morning, carrying students, farmers and the occasional tourist. ",
    "Bakers rose before dawn to light their ovens, and the smell of bread filled the narrow streets. ",
    "On the hill above the town stood a lighthouse that had not guided a ship for many years. ",
]


def haystack(tokenizer, length: int, depth: float = 1 / 3) -> list[dict]:
    """Chat messages whose templated prompt is about `length` tokens, the needle at `depth` of the filler."""
    def size(text: str) -> int:
        return len(tokenizer.apply_chat_template([{"role": "user", "content": text + "\n\n" + QUESTION}],
                                                 add_generation_prompt=True, tokenize=True))

    sentences, i = [], 0
    per = len(tokenizer.encode(FILLER[0]))
    while size("".join(sentences)) + per < length:  # grow by a batch, then trim sentence by sentence
        batch = max(1, (length - size("".join(sentences))) // (per + 2))
        sentences += [FILLER[(i + k) % len(FILLER)] for k in range(batch)]
        i += batch
    while len(sentences) > 1 and size("".join(sentences) + NEEDLE) > length:
        sentences.pop()
    sentences.insert(int(len(sentences) * depth), NEEDLE)
    return [{"role": "user", "content": "".join(sentences) + "\n\n" + QUESTION}]


def progress(base_url: str, length: int, stop: threading.Event, every: float) -> None:
    """Print the prefill's progress while a request runs, so a run stopped before its answer still says how far
    it got: engine steps since the request began times the tokens one step prefills (/health), an estimate."""
    def health() -> dict:
        try:
            return httpx.get(base_url + "/health", timeout=10).json()
        except (httpx.HTTPError, ValueError):
            return {}

    t0, step0 = time.perf_counter(), health().get("step", 0)
    while not stop.wait(every):
        h = health()
        per_step = (h.get("prefill") or {}).get("tokens_per_step") or 0
        done = min(length, (h.get("step", step0) - step0) * per_step)
        print(f"[needle] {time.perf_counter() - t0:.0f} s: ~{done}/{length} prompt tokens prefilled "
              f"({per_step} a step), load average {cpu.load_average():.1f}", file=sys.stderr, flush=True)


def ask(base_url: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed greedy chat request: the answer, its prompt tokens and the time to the first token."""
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    out = stream(base_url + "/v1/chat/completions", body, lambda choice: (choice.get("delta") or {}).get("content"))
    if "error" in out:
        return out
    usage = out["usage"]
    return {"answer": out["text"], "found": CODE in out["text"], "prompt_tokens": usage.get("prompt_tokens"),
            "ttft_s": out["ttft_s"], "total_s": out["total_s"]}


def stream(url: str, body: dict, piece: Callable[[dict], str | None]) -> dict:
    """One streamed request (with usage): its text (piece: a choice's text in this endpoint's chunks), usage, the
    time to its first text and in all; {"error": ...} when it fails."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0, first, text, usage = time.perf_counter(), None, "", {}
    with httpx.stream("POST", url, json=body, timeout=REQUEST_TIMEOUT + 60) as r:
        if r.status_code != 200:
            r.read()
            return {"error": f"{r.status_code}: {r.text[:300]}"}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": chunk["error"].get("message", str(chunk))}
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                if (text_piece := piece(choice) or "") and first is None:
                    first = time.perf_counter()
                text += text_piece
    return {"text": text, "usage": usage, "ttft_s": (first - t0) if first else None,
            "total_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.needle", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--lengths", default="1000,2000,4000,8000", help="prompt tokens, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/mlx-cluster-serve").expanduser())
    parser.add_argument("--out", type=Path, default=servers.REPO / "bench" / "results")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--progress-every", type=float, default=60.0, help="seconds between progress lines")
    args = parser.parse_args(argv)
    from mlx_lm.utils import load_tokenizer

    model_path, model_name = resolve_model(args.model, args.cache_dir)
    tokenizer = load_tokenizer(model_path)
    lengths = [int(n) for n in args.lengths.split(",") if n]
    prompts = {n: haystack(tokenizer, n) for n in lengths}
    work, rows = servers.Workdir(), []
    try:
        for ranks in [int(r) for r in args.ranks.split(",") if r]:
            server = servers.start_ours(work, model_name, args.cache_dir, ranks, PROMPT_CACHE_BYTES="0",
                                        REQUEST_TIMEOUT=str(REQUEST_TIMEOUT))
            try:
                for n in lengths:
                    load0, stop = cpu.load_average(), threading.Event()
                    watcher = threading.Thread(target=progress, args=(server.base_url, n, stop, args.progress_every),
                                               daemon=True)
                    watcher.start()
                    try:
                        answer = ask(server.base_url, prompts[n], args.max_tokens)
                    finally:
                        stop.set()
                    row = {"ranks": ranks, "length": n, **answer, "load_average": load0}
                    print(f"[needle] {json.dumps(row)}", file=sys.stderr, flush=True)
                    rows.append(row)
            finally:
                server.stop()
    finally:
        work.finish(args.keep_logs)
    print(f"## Needle: {model_name}, \"{NEEDLE.strip()}\" at a third of the prompt, prefix cache off, greedy\n")
    print("| ranks | prompt tokens | answer contains 4417 | prefill (TTFT) s | load average | answer |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['ranks']} | ~{r['length']} | error | – | {r['load_average']:.1f} | {r['error']} |")
            continue
        ttft = f"{r['ttft_s']:.1f}" if r["ttft_s"] else "–"
        answer = r["answer"].strip().replace("\n", " ").replace("|", "\\|")
        print(f"| {r['ranks']} | {r['prompt_tokens']} | {'yes' if r['found'] else '**no**'} | {ttft} | "
              f"{r['load_average']:.1f} | {answer} |")
    servers.save(args.out, f"needle-{Path(model_name).name}", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
