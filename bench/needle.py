"""`python -m bench.needle`: a fact buried in a long prompt, asked at the end, answered in words, on 1 and 2 ranks.

A needle ("The secret code is 4417.") sits in filler prose at a depth of the prompt (`--design`: `late`, the
default, 90 % of the way in, where SmolLM2-135M finds it at 8k; `late-primed` also starts the assistant's answer with
"The secret code is"; `third`, the first design, a third of the way in, which it misses from 4k on).
For each rank count (`--ranks 1,2`; 2 is `mlx.launch --backend ring`, where a model whose heads do not divide
pipelines itself) and each prompt length (`--lengths`, tokens of the chat-templated prompt), one greedy request
through our API (`/v1/completions` on the templated token ids, the prefix cache off: every prefill is cold): whether
the answer contains the code, the time to its first token (the prefill) and the answer itself. mlx-lm's own
`stream_generate` in-process answers the same ids first, as the reference (`--no-reference` skips it).

    python -m bench.needle --model smollm2-135m --lengths 8000
    python -m bench.needle --model smollm2-135m --lengths 1000 --ranks 2 --design third --no-reference
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Design:
    depth: float  # where the needle sits in the filler, 0 first .. 1 last
    prime: str  # the start of the assistant's answer, continued by the model ("" = a fresh assistant turn)
    about: str


DESIGNS = {
    "late": Design(0.9, "", "90 % of the way in, a fresh assistant turn"),
    "late-primed": Design(0.9, "The secret code is", "90 % of the way in, the answer begun with \"The secret code is\""),
    "third": Design(1 / 3, "", "a third of the way in, a fresh assistant turn"),
}


def prompt_ids(tokenizer, length: int, design: Design) -> list[int]:
    """The chat-templated prompt of about `length` tokens (the prime included), the needle at the design's depth."""
    def ids(body: str) -> list[int]:
        messages = [{"role": "user", "content": body + "\n\n" + QUESTION}]
        if not design.prime:
            return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        return list(tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": design.prime}],
                                                  continue_final_message=True, tokenize=True))

    sentences, i = [], 0
    per = len(tokenizer.encode(FILLER[0]))
    while len(ids("".join(sentences))) + per < length:  # grow by a batch, then trim sentence by sentence
        batch = max(1, (length - len(ids("".join(sentences)))) // (per + 2))
        sentences += [FILLER[(i + k) % len(FILLER)] for k in range(batch)]
        i += batch
    while len(sentences) > 1 and len(ids("".join(sentences) + NEEDLE)) > length:
        sentences.pop()
    sentences.insert(int(len(sentences) * design.depth), NEEDLE)
    return ids("".join(sentences))


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


def ask(base_url: str, ids: list[int], max_tokens: int) -> dict:
    """One streamed greedy completion of the prompt's ids: the answer, its prompt tokens and the time to its first
    token."""
    body = {"model": "default", "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0}
    out = stream(base_url + "/v1/completions", body, lambda choice: choice.get("text"))
    if "error" in out:
        return out
    return {"answer": out["text"], "prompt_tokens": out["usage"].get("prompt_tokens"), "ttft_s": out["ttft_s"],
            "total_s": out["total_s"]}


def in_process(model_path: Path, ids: list[int], max_tokens: int) -> dict:
    """The reference: mlx-lm's own `stream_generate` in this process, greedy, on the same ids."""
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = load(str(model_path))
    t0, first, text = time.perf_counter(), None, ""
    for response in stream_generate(model, tokenizer, ids, max_tokens=max_tokens, sampler=make_sampler(0.0)):
        first = first or time.perf_counter()
        text += response.text
    return {"answer": text, "prompt_tokens": len(ids), "ttft_s": first - t0, "total_s": time.perf_counter() - t0}


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
    parser.add_argument("--lengths", default="8000", help="prompt tokens, comma-separated")
    parser.add_argument("--design", choices=sorted(DESIGNS), default="late")
    parser.add_argument("--no-reference", action="store_true", help="skip mlx-lm's stream_generate in-process")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/mlx-cluster-serve").expanduser())
    parser.add_argument("--out", type=Path, default=servers.REPO / "bench" / "results")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--progress-every", type=float, default=60.0, help="seconds between progress lines")
    args = parser.parse_args(argv)
    from mlx_lm.utils import load_tokenizer

    model_path, model_name = resolve_model(args.model, args.cache_dir)
    tokenizer = load_tokenizer(model_path)
    design = DESIGNS[args.design]
    lengths = [int(n) for n in args.lengths.split(",") if n]
    prompts = {n: prompt_ids(tokenizer, n, design) for n in lengths}
    rows = []

    def record(who: str, n: int, answer: dict, load0: float) -> None:
        if "answer" in answer:
            answer = {**answer, "answer": design.prime + answer["answer"], "found": CODE in answer["answer"]}
        rows.append({"ranks": who, "length": n, **answer, "load_average": load0})
        print(f"[needle] {json.dumps(rows[-1])}", file=sys.stderr, flush=True)

    if not args.no_reference:
        for n in lengths:
            load0 = cpu.load_average()
            record("mlx-lm in-process", n, in_process(model_path, prompts[n], args.max_tokens), load0)
    work = servers.Workdir()
    try:
        for ranks in [int(r) for r in args.ranks.split(",") if r]:
            server = servers.start_ours(work, model_name, args.cache_dir, ranks, PROMPT_CACHE_BYTES="0",
                                        REQUEST_TIMEOUT=str(REQUEST_TIMEOUT))
            try:
                parallel = httpx.get(server.base_url + "/health", timeout=10).json().get("parallel") or "single"
                for n in lengths:
                    load0, stop = cpu.load_average(), threading.Event()
                    watcher = threading.Thread(target=progress, args=(server.base_url, n, stop, args.progress_every),
                                               daemon=True)
                    watcher.start()
                    try:
                        answer = ask(server.base_url, prompts[n], args.max_tokens)
                    finally:
                        stop.set()
                    record(f"{ranks} ({parallel})", n, answer, load0)
            finally:
                server.stop()
    finally:
        work.finish(args.keep_logs)
    print(f"## Needle: {model_name}, \"{NEEDLE.strip()}\" {design.about}, prefix cache off, greedy\n")
    print(f"| ranks | prompt tokens | answer contains {CODE} | prefill (TTFT) s | load average | answer |")
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
