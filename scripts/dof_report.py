"""Algorithm 1 on a teacher: capture q/k on local text, per-head DoF, allocation → dof.json.

Example (the embedded SmolLM2-135M on a local Wikipedia file, automatic λ):
    python scripts/dof_report.py --corpus enwiki.txt.gz --teacher smollm2-135m-instruct --lam auto --out dof.json
The corpus is --corpus or else $LIT_DOF_CORPUS (as for the quickstart); there is no default file.
Prints one line per λ rule and the per-layer dims; writes the report of the first --lam.
"""

from __future__ import annotations

import argparse
import ast
import operator
import os
import time

import torch

from lit_dof.data.corpus import iter_documents
from lit_dof.dof import collect_samples, dof_report
from lit_dof.teacher import DEFAULT_TEACHER
from lit_dof.teacher.loading import load_teacher

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def parse_number(text: str) -> float:
    """A λ value written as arithmetic on numbers (``2**64``, ``2^-4``, ``1e-3``, ``0.5*2**10``), never ``eval``'d:
    only numeric literals, unary ±, and + − × / ** (``^`` read as ``**``) are accepted.

    Raises:
        ValueError: anything else (a name, a call, a string), or an exponent beyond ±4096.
    """

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 4096:
                raise ValueError(f"exponent {right} out of range in {text!r}")
            return _OPERATORS[type(node.op)](left, right)
        raise ValueError(f"not a number or arithmetic on numbers: {text!r}")

    try:
        tree = ast.parse(text.replace("^", "**"), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not a number or arithmetic on numbers: {text!r}") from error
    return float(value(tree.body))


def parse_lam(rule: str) -> tuple[str | None, str | float]:
    """``--lam`` rule → (relative_to, λ): ``auto``, an absolute value, or ``RELATIVE_TO:VALUE``
    (``trace:2**-8``, ``max_eigenvalue:2**-4``)."""
    rel, _, value = rule.rpartition(":")
    return rel or None, "auto" if value == "auto" else parse_number(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default=DEFAULT_TEACHER)
    parser.add_argument(
        "--corpus",
        default=os.environ.get("LIT_DOF_CORPUS"),
        help="the text corpus (.txt/.txt.gz, one document per block; default $LIT_DOF_CORPUS)",
    )
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--num-samples", type=int, default=1024)
    parser.add_argument("--pooling", default="query_head", choices=["kv_head", "query_head"])
    parser.add_argument(
        "--lam",
        nargs="+",
        default=["auto", "2**-4", "2**64", "trace:2**-8"],
        help="λ rules: 'auto', an absolute value (a number or arithmetic such as 2**64), or 'trace:VALUE' / "
        "'max_eigenvalue:VALUE'",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not args.corpus:
        parser.error("no corpus: pass --corpus FILE or set LIT_DOF_CORPUS (a .txt or .txt.gz file)")
    if not os.path.isfile(args.corpus):
        parser.error(f"--corpus {args.corpus}: no such file")
    try:
        rules = [(rule, *parse_lam(rule)) for rule in args.lam]
    except ValueError as error:
        parser.error(f"--lam: {error}")

    model, tok = load_teacher(args.teacher)
    docs = (d for d in iter_documents(args.corpus) if len(d) > 4 * args.seq_len)
    ids = []
    for doc in docs:
        t = tok(doc, return_tensors="pt").input_ids[0]
        if t.numel() >= args.seq_len:
            ids.append(t[: args.seq_len])
        if len(ids) == args.sequences:
            break
    batches = [torch.stack(ids[i : i + 4]) for i in range(0, len(ids), 4)]
    t0 = time.perf_counter()
    reservoir, tokens = collect_samples(model, batches, args.num_samples, pooling=args.pooling)
    print(f"captured {tokens} tokens in {time.perf_counter() - t0:.1f} s")
    first = None
    for rule, rel, lam in rules:
        t0 = time.perf_counter()
        report = dof_report(model, reservoir, tokens, lam, relative_to=rel, pooling=args.pooling, name=args.teacher)
        dims = report.feature_dims("dof")
        lay = [x for x in report.layer_dof if x is not None]
        print(
            f"lam={rule} (abs {report.lam:.3g}, log2 {torch.tensor(report.lam).log2().item():.1f}): "
            f"layer DoF {min(lay):.1f}..{max(lay):.1f}, dof dims {min(dims)}..{max(dims)} "
            f"(spread {max(dims) - min(dims)}), warnings={len(report.warnings)}, {time.perf_counter() - t0:.1f} s"
        )
        print("  dims:", dims)
        first = first or report
    if args.out:
        first.save(args.out)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
