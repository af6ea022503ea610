"""Sample lines in SGLang's own formats, written by hand from the format strings of the 0.5.23 wheel (and the 0.4
lines the issue names): the server log (metrics_reporter.py:754-761, 963, 1005, 1039-1042; pool_stats_observer.py
104-145; scheduler.py:1268-1276; memory_pool.py:2087-2098, 1004-1009; model_runner.py:1372-1379), one
ForwardPassMetrics per JSON line (forward_pass_metrics.py:72-126) and a bench_serving result (serving.py:1855-1952)."""

import json

T = "2026-11-02 10:15"
STARTUP_0523 = [
    f"[{T}:00 TP0] Load weight end. elapsed=12.34 s, type=LlamaForCausalLM, avail mem=63.21 GB, mem usage=14.99 GB.",
    f"[{T}:01 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 413868, K size: 25.26 GB, V size: 25.26 GB",
    f"[{T}:02 TP0] max_total_num_tokens=413868, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=4096, context_len=131072, available_gpu_mem=10.51 GB",
]
MAMBA_0523 = (f"[{T}:01 TP0] Mamba Cache is allocated. max_mamba_cache_size: 256, conv_state size: 0.10GB, "
              "ssm_state size: 3.51GB ")


def decode_0523(sec: int, running: int, tokens: int, thr: float, queue: int = 0, prefix: str = "TP0") -> str:
    return (f"[{T}:{sec:02d} {prefix}] Decode batch, #running-req: {running}, #token: {tokens}, token usage: 0.10, "
            f"cuda graph: True, gen throughput (token/s): {thr:.2f}, #queue-req: {queue}")


def prefill_0523(sec: int, new_seq: int, new_tok: int, prefix: str = "TP0") -> str:
    return (f"[{T}:{sec:02d} {prefix}] Prefill batch, #new-seq: {new_seq}, #new-token: {new_tok}, #cached-token: 0, "
            "token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
            "input throughput (token/s): 0.00")


DECODE_04 = ("[2025-03-01 08:00:01 TP0] Decode batch. #running-req: 8, #token: 9000, token usage: 0.02, "
             "gen throughput (token/s): 600.12, #queue-req: 0")
DECODE_04_GRAPH = ("[2025-03-01 08:00:05 TP0] Decode batch. #running-req: 8, #token: 9320, token usage: 0.02, "
                   "cuda graph: True, gen throughput (token/s): 640.00, #queue-req: 0, ")
PREFILL_04 = ("[2025-03-01 08:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, "
              "token usage: 0.00, #running-req: 0, #queue-req: 0")
DECODE_HYBRID = (f"[{T}:30 TP0] Decode batch, #running-req: 16, #full token: 20000, full token usage: 0.05, "
                 "mamba num: 32, mamba usage: 0.10, cuda graph: True, gen throughput (token/s): 1500.00, "
                 "#queue-req: 0")
DECODE_SPEC = (f"[{T}:31 TP0] Decode batch, #running-req: 4, #token: 5000, token usage: 0.01, accept len: 2.50, "
               "accept rate: 0.50, cuda graph: True, gen throughput (token/s): 500.00, #queue-req: 0")


def fpm(counter: int, wall: float, *, n_p=0, e=0, var_p=0.0, p=0, n_d=0, kv=0, ts=1.7e9, dp=0) -> dict:
    return {"version": 1, "worker_id": "w0", "dp_rank": dp, "counter_id": counter, "wall_time": wall,
            "scheduled_requests": {"num_prefill_requests": n_p, "sum_prefill_tokens": e, "var_prefill_length": var_p,
                                   "sum_prefill_kv_tokens": p, "num_decode_requests": n_d,
                                   "sum_decode_kv_tokens": kv, "var_decode_kv_tokens": 0.0},
            "queued_requests": {"num_prefill_requests": 0, "sum_prefill_tokens": 0, "var_prefill_length": 0.0,
                                "num_decode_requests": 0, "sum_decode_kv_tokens": 0, "var_decode_kv_tokens": 0.0},
            "timestamp": ts + counter * 0.01, "endpoint": f"ipc:///tmp/fpm.{dp}"}


def bench_result(details: bool = False, **over) -> dict:
    r = {"tag": None, "backend": "sglang", "dataset_name": "random-ids", "request_rate": float("inf"),
         "max_concurrency": 4, "sharegpt_output_len": None, "random_input_len": 256, "random_output_len": 32,
         "random_range_ratio": 1.0, "server_info": None, "duration": 2.5, "completed": 8,
         "total_input_tokens": 2048, "total_input_text_tokens": 2048, "total_input_vision_tokens": 0,
         "total_output_tokens": 256, "total_output_tokens_retokenized": 256, "request_throughput": 3.2,
         "input_throughput": 819.2, "output_throughput": 102.4, "total_throughput": 921.6,
         "concurrency": 3.9, "accept_length": None, "max_output_tokens_per_s": 130.0, "max_concurrent_requests": 4}
    for m, base in (("e2e_latency", 1200.0), ("ttft", 40.0), ("tpot", 37.0), ("itl", 37.0)):
        r.update({f"mean_{m}_ms": base, f"median_{m}_ms": base, f"std_{m}_ms": 1.0, f"p90_{m}_ms": base * 1.1,
                  f"p95_{m}_ms": base * 1.2, f"p99_{m}_ms": base * 1.3})
    if details:
        r.update({"input_lens": [256] * 8, "output_lens": [32] * 8, "ttfts": [0.04] * 8,
                  "itls": [[0.037] * 31] * 8, "generated_texts": [""] * 8, "errors": [""] * 8})
    r.update(over)
    return r


def write_lines(path, lines) -> str:
    path.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines) + "\n")
    return str(path)
