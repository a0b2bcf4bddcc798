"""JSON-schema validation evals (import: dllm_constrain.evals).

    python -m dllm_constrain.evals jsonschemabench --data DIR --subsets A,B --n N --tokenizer PATH --out DIR
    python -m dllm_constrain.evals test-suite --data DIR

Modules: data (loaders), reference (jsonschema validator, remote refs), tok (tokenizers), engines (adapters:
ours, llguidance, xgrammar, outlines-core), worker (one engine per subprocess, time/memory limits),
runner (resumable JSONL), report (summaries, Markdown, plots), cli. Results: evals/RESULTS.md.
"""
