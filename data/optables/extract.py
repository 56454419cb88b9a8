#!/usr/bin/env python3
"""Builds kbench op tables (data/optables/<system>/*.csv) from AIConfigurator's CSVs.

Usage: python3 data/optables/extract.py /work/shared/data/aiconfigurator data/optables

Every output file has the same header: op,x1,x2,x3,latency_ms (see docs/cost-model.md,
"Op-table format"). Rows are filtered to the shapes kbench prices (Kimi-K2.5 / DeepSeek-V3
at TP 1 and 8, and their EAGLE-3 draft head); duplicate keys keep the first row.
"""
import csv, os, sys

SYSTEMS = ["rtx_pro_6000_server", "h200_sxm"]
# GEMM (n, k) the cost model asks for at TP 1 and TP 8 (target and draft); rows are kept
# for the grid values that bracket each, so interpolation never leaves the kept grid.
NEED_N = [2112, 24576, 3072, 1536, 7168, 4096, 512, 36864, 4608, 384, 163840, 20480,
          32000, 4000, 24576 // 8, 3 * 8192, 2 * 18432, 256, 64]
NEED_K = [7168, 1536, 8192, 1024, 2048, 256, 18432, 2304, 21504, 14336]
HEADS = {"1", "8", "64"}  # MLA / MHA heads per GPU: 64 heads at TP 8 and TP 1 (+1 for TP 64)


def bracket(vals, want):
    vals = sorted(vals)
    keep = set()
    for w in want:
        lo = [v for v in vals if v <= w]
        hi = [v for v in vals if v >= w]
        if lo:
            keep.add(lo[-1])
        if hi:
            keep.add(hi[0])
    return keep


def main(src_root, dst_root):
    for system in SYSTEMS:
        src = os.path.join(src_root, system)
        dst = os.path.join(dst_root, system)
        os.makedirs(dst, exist_ok=True)
        out = {}

        def add(fname, op, x1, x2, x3, lat):
            out.setdefault(fname, {}).setdefault((op, x1, x2, x3), lat)

        rows = list(csv.DictReader(open(os.path.join(src, "sglang_0.5.14_gemm_bf16.csv"))))
        ns = bracket({int(r["n"]) for r in rows}, NEED_N)
        ks = bracket({int(r["k"]) for r in rows}, NEED_K)
        for r in rows:
            n, k = int(r["n"]), int(r["k"])
            if n in ns and k in ks:
                add("gemm.csv", "gemm/bf16", n, k, int(r["m"]), r["latency"])

        for r in csv.DictReader(open(os.path.join(src, "sglang_0.5.14_moe_h7168_i2048.csv"))):
            if r["moe_dtype"] == "int4_wo" and r["moe_ep_size"] == "1":
                op = "moe/int4_wo/h7168/i2048/e%s/k%s/%s" % (r["num_experts"], r["topk"], r["distribution"])
                add("moe.csv", op, int(r["moe_tp_size"]), int(r["num_tokens"]), 1, r["latency"])

        for fname, op in [("sglang_0.5.14_mla_generation.csv", "mla_gen/bf16"),
                          ("sglang_0.5.14_mla_context.csv", "mla_ctx/bf16")]:
            for r in csv.DictReader(open(os.path.join(src, fname))):
                if r["kv_cache_dtype"] != "bfloat16" or r["num_heads"] not in HEADS:
                    continue
                ctx = int(r["step"]) if op.startswith("mla_gen") else int(r["isl"])
                add("mla.csv", op, int(r["num_heads"]), int(r["batch_size"]), ctx, r["latency"])

        for r in csv.DictReader(open(os.path.join(src, "sglang_0.5.14_mla_bmm.csv"))):
            if r["bmm_dtype"] == "bfloat16" and r["num_heads"] in HEADS:
                op = "mla_bmm_pre/bf16" if r["op_name"] == "mla_gen_pre" else "mla_bmm_post/bf16"
                add("mla.csv", op, int(r["num_heads"]), int(r["num_tokens"]), 1, r["latency"])

        # The draft's MHA layer: heads == kv heads, bf16 KV cache, no sliding window.
        # RTX PRO 6000: only flashinfer has MHA rows (triton was measured for GQA only);
        # H200 has fa3 only.
        for fname, op, ctxcol in [("sglang_0.5.14_attention_generation_hd128.csv", "attn_gen/hd128/bf16", "step"),
                                  ("sglang_0.5.14_attention_context_hd128.csv", "attn_ctx/hd128/bf16", "isl")]:
            for r in csv.DictReader(open(os.path.join(src, fname))):
                if r["kernel_source"] not in ("flashinfer", "fa3"):
                    continue
                if r["attn_dtype"] != "bfloat16" or r["kv_cache_dtype"] != "bfloat16":
                    continue
                if r.get("window_size", "0") != "0" or r["num_heads"] != r["num_key_value_heads"]:
                    continue
                if r["num_heads"] not in HEADS:
                    continue
                add("attention.csv", op, int(r["num_heads"]), int(r["batch_size"]), int(r[ctxcol]), r["latency"])

        for r in csv.DictReader(open(os.path.join(src, "nccl_2.29.2.csv"))):
            if r["nccl_dtype"] == "half" and r["op_name"] in ("all_reduce", "all_gather"):
                add("nccl.csv", "%s/half" % r["op_name"], int(r["num_gpus"]), int(r["message_size"]), 1, r["latency"])

        # The custom all-reduce (one-shot / two-shot over IPC buffers) as a CUDA graph
        # replays it: what an engine's decode steps run below its size cap.
        for r in csv.DictReader(open(os.path.join(src, "sglang_0.5.14_custom_allreduce.csv"))):
            if r["allreduce_dtype"] == "bfloat16" and r["backend"] == "sglang_graph":
                add("nccl.csv", "custom_all_reduce/half", int(r["num_gpus"]), int(r["message_size"]), 1, r["latency"])

        for fname, rows in out.items():
            with open(os.path.join(dst, fname), "w", newline="") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow(["op", "x1", "x2", "x3", "latency_ms"])
                for (op, x1, x2, x3), lat in sorted(rows.items()):
                    w.writerow([op, x1, x2, x3, "%.6g" % float(lat)])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
