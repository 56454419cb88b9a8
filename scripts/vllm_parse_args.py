"""Read `kbench vllm-args` output on stdin and put every `vllm serve` line through vLLM's
own command line: the parser `vllm serve` builds (vllm/entrypoints/cli/main.py: a
FlexibleArgumentParser with ServeSubcommand's subparser, make_arg_parser), the serve
command's own validation, `AsyncEngineArgs.from_cli_args`, the cache, parallel and scheduler
configs those arguments build (their own value checks), the `--speculative-config` keys
against SpeculativeConfig's fields and its `method` against the methods vLLM names, and the
CompilationConfig the flags build. Nothing is downloaded and no engine starts.

Prints one JSON object per line ({"label", "line", "ok", "error"}) and exits 1 if any line
was rejected. Run it with the python of the vLLM install (scripts/real-vllm.sh).
"""

import contextlib
import dataclasses
import io
import json
import logging
import os
import shlex
import sys
import typing
import warnings

# With the hub offline, from_cli_args looks the model name up in the local cache and
# refuses a name it has never downloaded; online, it tolerates a failed lookup. So the hub
# is left online and pointed at a closed loopback port: nothing leaves this machine.
os.environ["HF_HUB_OFFLINE"] = "0"
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def serve_parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    return parser, serve


def speculative_problems(spec):
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    unknown = sorted(k for k in spec if k.replace("-", "_") not in fields)
    problems = [f"unknown --speculative-config keys {unknown}"] if unknown else []
    methods = set()
    for arg in typing.get_args(SpeculativeMethod):
        methods.update(typing.get_args(arg) or (arg,))
    method = spec.get("method")
    if method is not None and method not in methods:
        problems.append(f"method {method!r} is none of vLLM's {sorted(methods)}")
    return problems


def compilation_problem(engine_args):
    from vllm.config import CompilationConfig

    fields = {
        f.name: getattr(engine_args.compilation_config, f.name)
        for f in dataclasses.fields(CompilationConfig)
        if f.init
    }
    default = CompilationConfig()
    changed = {k: v for k, v in fields.items() if v != getattr(default, k)}
    if engine_args.max_cudagraph_capture_size is not None:
        changed["max_cudagraph_capture_size"] = engine_args.max_cudagraph_capture_size
    try:
        CompilationConfig(**changed)
    except Exception as e:  # noqa: BLE001 - any refusal is the answer
        return f"CompilationConfig: {type(e).__name__}: {e}"
    return None


def engine_config_problems(engine_args):
    """The configs `create_engine_config` builds from these arguments that need no model:
    their own field checks (a fraction above 1, a TP of 0, a token budget below the
    sequences) run as vLLM's would."""
    from vllm.config import CacheConfig, ParallelConfig, SchedulerConfig

    def given(**fields):
        return {k: v for k, v in fields.items() if v is not None}

    ea = engine_args
    builds = {
        "CacheConfig": lambda: CacheConfig(
            **given(
                gpu_memory_utilization=ea.gpu_memory_utilization,
                block_size=ea.block_size,
                cache_dtype=ea.kv_cache_dtype,
                enable_prefix_caching=ea.enable_prefix_caching,
            )
        ),
        "ParallelConfig": lambda: ParallelConfig(
            **given(tensor_parallel_size=ea.tensor_parallel_size)
        ),
        # a line without --max-model-len leaves it to the checkpoint's context, which is not
        # here: a long one stands in
        "SchedulerConfig": lambda: SchedulerConfig(
            is_encoder_decoder=False,
            max_model_len=ea.max_model_len or 262144,
            **given(
                max_num_batched_tokens=ea.max_num_batched_tokens,
                max_num_seqs=ea.max_num_seqs,
                enable_chunked_prefill=ea.enable_chunked_prefill,
            ),
        ),
    }
    problems = []
    for name, build in builds.items():
        try:
            build()
        except Exception as e:  # noqa: BLE001 - any refusal is the answer
            problems.append(f"{name}: {type(e).__name__}: {e}")
    return problems


def check(parser, serve, line):
    from vllm.engine.arg_utils import AsyncEngineArgs

    argv = shlex.split(line)
    while argv and "=" in argv[0] and not argv[0].startswith("-"):
        argv.pop(0)  # an environment prefix
    if argv[:2] != ["vllm", "serve"]:
        return f"not a `vllm serve` line: {line}"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv[1:])
    except SystemExit:
        return "parser: " + " ".join(stderr.getvalue().strip().splitlines()[-1:])
    except Exception as e:  # noqa: BLE001 - a flag's own type can refuse its value
        return f"parser: {type(e).__name__}: {e}"
    try:
        serve.validate(args)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception as e:  # noqa: BLE001
        return f"from_cli_args: {type(e).__name__}: {e}"
    problems = engine_config_problems(engine_args)
    if engine_args.speculative_config is not None:
        problems += speculative_problems(engine_args.speculative_config)
    problem = compilation_problem(engine_args)
    if problem:
        problems.append(problem)
    return "; ".join(problems) or None


def main():
    parser, serve = serve_parser()
    label, rejected = None, 0
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            label = line.lstrip("# ")
            continue
        error = check(parser, serve, line)
        rejected += error is not None
        print(json.dumps({"label": label, "line": line, "ok": error is None, "error": error}))
        label = None
    sys.exit(1 if rejected else 0)


if __name__ == "__main__":
    main()
