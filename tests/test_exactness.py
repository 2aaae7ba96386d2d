"""The self-check at load (engine.exactness): the kernels that keep plain decoding's answer, found on the
machine that runs the tests, and on the other CPU classes this machine can be steered to.

A CI machine with AVX512-BF16 steered to AVX2 runs the AVX2 kernels (oneDNN's, ATen's and MKL's choice of
code path all follow the variables), so the class most users have is tested wherever the tests run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from test_engine_exactness import NoisyOracleDrafter
from test_invariant import auto_dtype, chunked_logits, wide_model

from specedit.cli.main import main
from specedit.engine.loop.generate import Engine, Generation
from specedit.engine.model import exactness, invariant, kernels
from specedit.engine.model.loading import LoadedModel, precision
from specedit.engine.records.errors import ModelLoadError

TESTS = Path(__file__).resolve().parent

# What the kernels of each CPU class are steered with (read once, when the libraries start: a subprocess).
STEERING = {
    "AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "SSE4.1": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "AVX512": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    },
}


def _perturb_final_norm(loaded: LoadedModel, rows_to_offset: Any) -> None:
    """A stand-in for a shape-dependent kernel: the final norm's output moves by `rows_to_offset(rows)`."""

    def hook(module: Any, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return output + rows_to_offset(output.shape[-2])

    loaded.model.model.norm.register_forward_hook(hook)


def test_the_self_check_finds_kernels_that_keep_the_answer() -> None:
    dtype = auto_dtype()
    loaded = wide_model(512, dtype)
    verdict = loaded.exactness
    assert verdict is not None and verdict.bitwise and verdict.claim == "bitwise"
    assert verdict.attention == "row-invariant"
    assert verdict.threads == torch.get_num_threads() and verdict.dtype == str(dtype).removeprefix("torch.")
    assert exactness.probe_holds(loaded)
    assert "bit for bit" in verdict.describe() and verdict.cpu_class in verdict.describe()
    assert f"{verdict.dtype} cache" in verdict.describe()  # transformers' model: its `DynamicCache`, its dtype


def test_a_kernel_that_differs_for_one_row_runs_one_token_as_two_rows() -> None:
    loaded = wide_model(512, auto_dtype())
    _perturb_final_norm(loaded, lambda rows: 1e-3 if rows == 1 else 0.0)
    loaded.exactness = exactness.settle(loaded)
    assert loaded.exactness.bitwise and loaded.step_rows == loaded.exactness.step_rows == 2
    speculative, plain = speculative_and_plain(loaded)
    assert speculative.tokens == plain.tokens


def speculative_and_plain(loaded: LoadedModel) -> tuple[Generation, Generation]:
    """60 tokens of a wide model (vocabulary 512, no EOS) after a fixed prompt: speculated on a noisy oracle
    of plain decoding's answer, and plain decoding's."""
    engine = Engine(loaded)
    engine.eos_token_ids = frozenset()
    prompt = list(range(100, 180))
    plain = engine.generate(prompt, max_new_tokens=60)
    return engine.generate(prompt, max_new_tokens=60, drafter=NoisyOracleDrafter(plain.tokens, 80, 512, 0)), plain


def test_where_nothing_holds_the_verdict_promises_no_bits() -> None:
    loaded = wide_model(512, torch.float32)
    _perturb_final_norm(loaded, lambda rows: 1e-3 * rows)  # every forward size gives other logits
    verdict = loaded.exactness = exactness.settle(loaded)
    assert not verdict.bitwise and verdict.claim == "up to near-ties"
    assert "up to near-ties" in verdict.describe()
    assert (verdict.linear, verdict.step_rows) == ("onednn-packed" if invariant.can_pack(torch.float32) else "aten", 1)
    assert Engine(loaded).generate(list(range(10, 40)), max_new_tokens=5).stats.exactness == verdict.to_dict()


def test_without_the_invariant_attention_nothing_is_promised(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on CUDA, where the row-invariant attention does not apply: no probe, no promise."""
    monkeypatch.setattr(invariant, "install_attention", lambda model: False)
    monkeypatch.setattr(exactness, "probe_holds", _no_probe)
    verdict = wide_model(512, torch.float32).exactness
    assert verdict is not None and not verdict.bitwise and verdict.attention == "transformers"


def _no_probe(loaded: Any) -> bool:
    raise AssertionError("the probe ran")


def test_a_verdict_is_remembered_until_the_machine_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = wide_model(512, torch.float32)
    first = exactness.settle(loaded, tmp_path)
    [saved] = tmp_path.glob("*.json")
    assert json.loads(saved.read_text())["bitwise"] is first.bitwise

    monkeypatch.setattr(exactness, "probe_holds", _no_probe)
    again = exactness.settle(
        wide_model(512, torch.float32, settle=False), tmp_path
    )  # same shapes, same machine: no probe
    assert (again.bitwise, again.linear, again.step_rows) == (first.bitwise, first.linear, first.step_rows)
    assert again.fewer_threads == first.fewer_threads

    saved.write_text("{not json")  # refused; once deleted, the probe decides
    with pytest.raises(ModelLoadError, match=rf"{saved.name} changed since specedit wrote it"):
        exactness.settle(wide_model(512, torch.float32, settle=False), tmp_path)
    saved.unlink()
    with pytest.raises(AssertionError, match="the probe ran"):
        exactness.settle(wide_model(512, torch.float32, settle=False), tmp_path)
    saved.write_text(json.dumps(first.to_dict()))
    for name, value in (("ONEDNN_MAX_CPU_ISA", "AVX2"), ("ATEN_CPU_CAPABILITY", "default")):
        with monkeypatch.context() as steered:
            steered.setenv(name, value)  # kernels steered elsewhere: another fingerprint
            with pytest.raises(AssertionError, match="the probe ran"):
                exactness.settle(wide_model(512, torch.float32, settle=False), tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        with pytest.raises(AssertionError, match="the probe ran"):
            exactness.settle(wide_model(512, torch.float32, settle=False), tmp_path)
    finally:
        torch.set_num_threads(threads)


def test_fewer_threads_are_offered_only_where_the_logits_stay_the_same() -> None:
    """`fewer_threads`: the counts below torch's on which the probe's logits are bitwise the same; a kernel
    whose result moves with the thread count offers none."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        loaded = wide_model(512, torch.float32)
        assert loaded.exactness is not None
        assert set(loaded.exactness.fewer_threads) <= {torch.get_num_threads() - 1, 1}
        assert all(exactness.same_on_threads(loaded, count) for count in loaded.exactness.fewer_threads)
        _perturb_final_norm(loaded, lambda rows: 1e-3 if torch.get_num_threads() == 1 else 0.0)
        verdict = exactness.settle(loaded)
        assert verdict.bitwise and verdict.fewer_threads == ()
    finally:
        torch.set_num_threads(threads)


def test_auto_precision_follows_the_cpu_and_its_steering(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--dtype auto`: float32 on int8 weights wherever the int8 kernel runs, AVX512-BF16 and AMX included;
    bf16 where it is native and the weights stay float; float32 elsewhere."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(kernels, "available", lambda folder=None: None)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(exactness, "cpu_class", lambda: "AVX512-BF16")
    assert exactness.native_bf16()
    assert precision("auto", "auto", cpu) == (torch.float32, True)
    assert precision("auto", "float", cpu) == (torch.bfloat16, False)
    assert precision("bfloat16", "auto", cpu) == (torch.bfloat16, False)
    for steered, native in (("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True), ("ALL", True)):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", steered)
        assert exactness.native_bf16() is native, steered
    monkeypatch.setattr(exactness, "cpu_class", lambda: "AMX")
    for steered in ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "DEFAULT"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", steered)
        assert exactness.native_bf16(), steered
        assert precision("auto", "auto", cpu) == (torch.float32, True), steered  # int8, as on AVX512-BF16
        assert precision("auto", "float", cpu) == (torch.bfloat16, False), steered
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(kernels, "available", lambda folder=None: "specedit's kernels need a C++ compiler (g++)")
    assert precision("auto", "auto", cpu) == (torch.bfloat16, False)  # no int8 kernel: native bf16 still
    monkeypatch.setattr(exactness, "cpu_class", lambda: "AVX2")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not exactness.native_bf16() and precision("auto", "auto", cpu) == (torch.float32, False)
    assert precision("auto", "auto", cuda) == (torch.bfloat16, False)
    with pytest.raises(ModelLoadError, match="int8 weights run on the CPU only"):
        precision("auto", "int8", cuda)
    with pytest.raises(ModelLoadError, match="unknown dtype 'half'"):
        precision("half", "auto", cpu)


def test_doctor_reports_the_verdict(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECEDIT_CACHE_DIR", str(tmp_path))
    assert main(["doctor", "--model", str(tiny_model_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exactness"]["claim"] == "bitwise" and report["exactness"]["cpu_class"] == exactness.cpu_class()
    assert set(report["forward_seconds"]) == {"1", "8", "32"}
    assert len(list((tmp_path / "exactness").glob("*.json"))) == 1  # remembered for the next load
    assert main(["doctor", "--model", str(tiny_model_dir)]) == 0
    assert "identical to plain decoding bit for bit" in capsys.readouterr().out


STEERED_CHECK = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from test_engine_exactness import NoisyOracleDrafter
    from test_invariant import auto_dtype, chunked_logits, wide_model
    from specedit.engine.loop.generate import Engine
    from specedit.engine.model.loading import precision

    print(json.dumps({"auto": str(precision("auto", "float", torch.device("cpu"))[0])}))
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.bfloat16):
            loaded = wide_model(512, dtype)
            ids = torch.randint(0, 512, (260,), generator=torch.Generator().manual_seed(threads)).tolist()
            reference = chunked_logits(loaded, ids[:200], ids[200:], 1)
            same = [torch.equal(chunked_logits(loaded, ids[:200], ids[200:], c), reference) for c in (2, 5, 17, 33)]
            engine = Engine(loaded)
            engine.eos_token_ids = frozenset()
            plain = engine.generate(ids[:100], max_new_tokens=60)
            drafter = NoisyOracleDrafter(plain.tokens, 100, 512, threads)
            speculative = engine.generate(ids[:100], max_new_tokens=60, drafter=drafter)
            print(json.dumps({
                "threads": threads, "dtype": str(dtype), "verdict": loaded.exactness.to_dict(),
                "logits_same": same, "tokens_same": speculative.tokens == plain.tokens,
            }))
    """
)


@pytest.mark.parametrize("cpu", list(STEERING))
def test_exact_on_every_cpu_class_this_machine_can_steer_to(cpu: str) -> None:
    """Float32 and bf16, 1, 2 and 4 threads, the kernels steered down to `cpu`: the self-check's kernels
    keep every position's logits and speculation keeps plain decoding's tokens. float32 (what `auto` picks
    on these classes) must be bitwise under AVX2 and SSE4.1 steering (verified on real AVX2 hardware), and
    anything on this CPU's own class. bf16 on a CPU steered below its own class runs kernels no real CPU of
    either class runs (torch still sees the hardware's bf16), and AVX-512 without bf16 has not been seen by
    this project: there the verdict must only be true, bitwise (then checked) or `up to near-ties`."""
    if cpu == "AVX512" and exactness.cpu_class() not in ("AVX512", "AVX512-BF16", "AMX"):
        pytest.skip(f"this CPU ({exactness.cpu_class()}) has no AVX-512 to steer to; AVX2 and SSE4.1 run here")
    environment = {**os.environ, **STEERING[cpu]}
    completed = subprocess.run(
        [sys.executable, "-c", STEERED_CHECK, str(TESTS)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [json.loads(line) for line in completed.stdout.splitlines()]
    assert lines[0]["auto"] == "torch.float32"  # steered below AVX512-BF16: float32, as on such a CPU
    assert len(lines) == 1 + 3 * 2
    own_class = exactness.cpu_class() == cpu
    for line in lines[1:]:
        verdict = line["verdict"]
        # float32 on the classes verified on real hardware (AVX2), and anything on this CPU's own.
        if (line["dtype"] == "torch.float32" and cpu != "AVX512") or own_class:
            assert verdict["bitwise"], line
        if verdict["bitwise"]:
            assert all(line["logits_same"]) and line["tokens_same"], line
        else:
            assert verdict["claim"] == "up to near-ties", line
        assert all(f"{name}={value}" in verdict["kernels"] for name, value in STEERING[cpu].items()), verdict


def test_chunked_logits_differ_without_the_self_checked_kernels() -> None:
    """The detector works: with transformers' kernels the wide model's logits depend on the forward size on
    this machine's CPU (the failure this guards against), with the self-check's they do not."""
    loaded = wide_model(512, torch.bfloat16 if exactness.native_bf16() else torch.float32)
    ids = torch.randint(0, 512, (260,), generator=torch.Generator().manual_seed(3)).tolist()
    checked = [chunked_logits(loaded, ids[:200], ids[200:], chunk) for chunk in (1, 17)]
    rows = loaded.step_rows
    loaded.step_rows = 1
    with invariant.stock_kernels(loaded.model):
        stock = [chunked_logits(loaded, ids[:200], ids[200:], chunk) for chunk in (1, 17)]
    loaded.step_rows = rows
    assert torch.equal(checked[0], checked[1])
    assert not torch.equal(stock[0], stock[1])
