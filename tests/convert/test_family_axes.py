"""--dynamic-batch on a Hugging Face directory makes the axes its family varies dynamic, named
as optimum names them: a seq2seq decoder's length, a waveform's samples, an image's height and
width where the model takes other sizes (a ViT's position table fixes them: exported at the
example's size, refused elsewhere). Each artifact is called in a fresh process at sizes the
conversion never saw and compared with the transformers model itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptconvert.convert.engine import convert_program
from ptconvert.model.axes import model_axes
from ptconvert.options import Options
from tests.conftest import run_cli

# argv: artifact, directory, auto class, then JSON: a list of {input: [shape, "int"|"float"]}
_CHECK = """
import json, sys
import torch, transformers
art, directory, auto, grid = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
model = getattr(transformers, auto).from_pretrained(directory).eval()
if art.endswith(".onnx"):
    import onnxruntime
    session = onnxruntime.InferenceSession(art)
    names = [o.name for o in session.get_outputs()]
    dims = {i.name: list(i.shape) for i in session.get_inputs()}
    def run(**kw):
        outs = session.run(None, {k: v.numpy() for k, v in kw.items()})
        return dict(zip(names, map(torch.from_numpy, outs)))
else:
    dims = None
    program = torch.export.load(art).module()
    run = lambda **kw: program(**kw)
gen = torch.Generator().manual_seed(3)
results = []
for cell in grid:
    kw = {n: (torch.randint(0, 90, shape, generator=gen) if kind == "int"
              else torch.ones(shape, dtype=torch.int64) if kind == "ones"
              else torch.randn(*shape, generator=gen)) for n, (shape, kind) in cell.items()}
    try:
        got = run(**kw)
    except Exception as exc:
        results.append(["raises", str(exc).splitlines()[0][:200]])
        continue
    with torch.no_grad():
        want = model(**kw, **({"use_cache": False} if "decoder_input_ids" in kw else {}))
    key = next(k for k in ("logits", "last_hidden_state") if getattr(want, k, None) is not None)
    got, want = got[key], getattr(want, key)
    ok = got.shape == want.shape and torch.allclose(got, want, atol=1e-4, rtol=1e-3)
    results.append(["match" if ok else "WRONG", list(got.shape), list(want.shape)])
print(json.dumps({"results": results, "dims": dims}))
"""


def _fresh(artifact: Path, directory: Path, auto: str, grid: list[dict[str, object]]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK, str(artifact), str(directory), auto, json.dumps(grid)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _save(kind: str, directory: Path) -> Path:
    import transformers as t

    configs = {
        "t5": (
            t.T5Config(
                vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                decoder_start_token_id=0,
            ),
            t.T5ForConditionalGeneration,
        ),
        "wav2vec2": (
            t.Wav2Vec2Config(
                vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, conv_dim=(16, 16), conv_stride=(4, 2), conv_kernel=(8, 4),
                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
            ),
            t.Wav2Vec2Model,
        ),
        "segformer": (
            t.SegformerConfig(
                num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=3,
            ),
            t.SegformerForSemanticSegmentation,
        ),
        "roberta": (
            t.RobertaConfig(
                vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=66, pad_token_id=1,
            ),
            t.RobertaModel,
        ),
        "vit": (
            t.ViTConfig(
                image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=37,
            ),
            t.ViTModel,
        ),
        "swin": (
            t.SwinConfig(
                image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 1],
                window_size=2, num_labels=3,
            ),
            t.SwinForImageClassification,
        ),
        "sam2": (
            t.Sam2Config(
                vision_config=dict(
                    backbone_config=dict(
                        model_type="sam2_hiera_det_model", hidden_size=8, num_attention_heads=1,
                        image_size=[64, 64], blocks_per_stage=[1, 1, 2, 1],
                        embed_dim_per_stage=[8, 16, 32, 64],
                        num_attention_heads_per_stage=[1, 1, 1, 1],
                        window_size_per_stage=[4, 4, 4, 2], global_attention_blocks=[3],
                        window_positional_embedding_background_size=[4, 4],
                    ),
                    backbone_channel_list=[64, 32, 16, 8],
                    backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]], fpn_hidden_size=16,
                ),
                prompt_encoder_config=dict(
                    hidden_size=16, image_size=64, patch_size=16, mask_input_channels=4
                ),
                mask_decoder_config=dict(
                    hidden_size=16, mlp_dim=32, num_hidden_layers=1, num_attention_heads=2,
                    iou_head_hidden_dim=16,
                ),
            ),
            t.Sam2Model,
        ),
    }  # fmt: skip
    config, cls = configs[kind]
    torch.manual_seed(0)
    model = cls(config).eval()
    model.config.architectures = [cls.__name__]
    model.save_pretrained(directory)
    if kind == "segformer":  # the image size comes from the image processor's config, as on the hub
        size = {"size": {"height": 32, "width": 32}}
        (directory / "preprocessor_config.json").write_text(json.dumps(size))
    return directory


def _axes(kind: str, tmp_path: Path) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
    import transformers

    from ptconvert.model.hf_inputs import from_hf_model

    directory = _save(kind, tmp_path / kind)
    model = transformers.AutoModel.from_pretrained(directory).eval()
    sample = from_hf_model(model, directory).at(2)
    return [(a.name, a.dims) for a in model_axes(model, sample)]


def test_each_family_names_the_axes_it_varies(tmp_path: Path) -> None:
    assert _axes("t5", tmp_path) == [
        ("sequence_length", (("input_ids", 1), ("attention_mask", 1))),
        ("decoder_sequence_length", (("decoder_input_ids", 1),)),
    ]
    assert _axes("wav2vec2", tmp_path) == [("sequence_length", (("input_values", 1),))]
    assert _axes("vit", tmp_path) == [
        ("height", (("pixel_values", 2),)),
        ("width", (("pixel_values", 3),)),
    ]


def test_a_position_table_offset_by_the_padding_index_bounds_the_sequence_below_its_size(
    tmp_path: Path,
) -> None:
    """RoBERTa numbers positions from padding_idx + 1: a table of 66 holds 64 tokens. The .pt2
    was written for 1–66 and 65 and 66 reached an index error inside (an AOTI package aborted
    the process there); now the program's own range refuses them."""
    axes = _axes("roberta", tmp_path)
    segments = (("input_ids", 1), ("attention_mask", 1), ("token_type_ids", 1))
    assert axes == [("sequence_length", segments)]
    directory = tmp_path / "roberta"
    out = tmp_path / "r.pt2"
    report = convert_program(directory, "pt2", out, Options(dynamic_batch=True, cache=False))
    assert report.dynamic_range["input_ids dim 1"].startswith("sequence length 2–64"), report
    grid = [
        {
            "input_ids": [[b, n], "int"],
            "attention_mask": [[b, n], "ones"],
            "token_type_ids": [[b, n], "ones"],
        }
        for b, n in ((1, 64), (2, 65))
    ]
    result = _fresh(out, directory, "AutoModel", grid)
    assert [r[0] for r in result["results"]] == ["match", "raises"], result
    assert "<= 64" in result["results"][1][1], result


def test_a_seq2seq_decoder_length_is_dynamic_and_named_as_optimum_names_it(
    tmp_path: Path,
) -> None:
    directory = _save("t5", tmp_path / "t5")
    out = tmp_path / "t5.onnx"
    report = convert_program(directory, "onnx", out, Options(dynamic_batch=True, cache=False))
    assert any("(decoder_sequence_length: sequence length 2 or more)" in n for n in report.notes)
    grid = [
        {
            "input_ids": [[b, n], "int"],
            "attention_mask": [[b, n], "ones"],
            "decoder_input_ids": [[b, d], "int"],
        }
        for b, n, d in ((1, 1, 1), (1, 13, 7), (5, 40, 13), (2, 3, 30))
    ]
    result = _fresh(out, directory, "AutoModelForSeq2SeqLM", grid)
    assert [r[0] for r in result["results"]] == ["match"] * 4, result
    dims = result["dims"]
    assert dims["input_ids"] == ["batch_size", "sequence_length"]
    assert dims["decoder_input_ids"] == ["batch_size", "decoder_sequence_length"]


def test_a_waveform_takes_any_length_from_the_shortest_one_frame(tmp_path: Path) -> None:
    directory = _save("wav2vec2", tmp_path / "w")
    out = tmp_path / "w.onnx"
    report = convert_program(directory, "onnx", out, Options(dynamic_batch=True, cache=False))
    # one frame needs (1 - 1) * 2 + 4 = 4 frames of the first conv: (4 - 1) * 4 + 8 = 20 samples
    # asked from; the note gives the range the program takes
    assert any("(sequence_length: any size" in n for n in report.notes), report.notes
    grid = [{"input_values": [[b, n], "float"]} for b, n in ((1, 20), (1, 21), (5, 333), (2, 1000))]
    result = _fresh(out, directory, "AutoModel", grid)
    assert [r[0] for r in result["results"]] == ["match"] * 4, result
    assert result["dims"]["input_values"] == ["batch_size", "sequence_length"]


@pytest.mark.slow
def test_an_image_model_that_takes_any_size_gets_dynamic_height_and_width(tmp_path: Path) -> None:
    directory = _save("segformer", tmp_path / "s")
    out = tmp_path / "s.pt2"
    report = convert_program(directory, "pt2", out, Options(dynamic_batch=True, cache=False))
    assert "pixel_values dim 2" in report.dynamic_range, report.dynamic_range
    grid = [
        {"pixel_values": [[b, 3, h, w], "float"]}
        for b, h, w in ((1, 32, 32), (2, 45, 61), (1, 96, 40))
    ]
    result = _fresh(out, directory, "AutoModelForSemanticSegmentation", grid)
    assert [r[0] for r in result["results"]] == ["match"] * 3, result


def test_an_image_size_the_model_fixes_is_kept_and_enforced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _save("vit", tmp_path / "v")
    out = tmp_path / "v.pt2"
    code, report, _ = run_cli(
        [str(directory), "--to", "pt2", "--dynamic-batch", "--no-cache", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert any("height and width could not be dynamic" in n for n in report["notes"])
    # a transformers model's program takes its inputs by keyword, as the call line says (BLIP's
    # tutorial called it positionally, ``prog(image)``)
    assert report["interface"]["call"].startswith("prog(pixel_values=…)"), report["interface"]
    assert report["interface"]["keyword"] is True
    grid = [{"pixel_values": [[b, 3, h, h], "float"]} for b, h in ((1, 32), (5, 32), (2, 48))]
    result = _fresh(out, directory, "AutoModel", grid)
    assert [r[0] for r in result["results"]] == ["match", "match", "raises"], result


@pytest.mark.slow
def test_height_and_width_that_cost_batch_1_are_given_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Swin with --dynamic-batch: with its height and width dynamic too, the program got a guard
    (a window count times the batch must not be 1) that refused batch 1, and the conversion
    exited 0 saying "batch 2 or more; not at 1". The family's axes were not asked for: the
    program is exported again without them, and batch 1 runs."""
    directory = _save("swin", tmp_path / "w")
    out = tmp_path / "w.pt2"
    code, report, _ = run_cli(
        [str(directory), "--to", "pt2", "--dynamic-batch", "--no-cache", "-o", str(out)], capsys
    )
    assert code == 0, report
    assert any("kept at the example's sizes" in n and "batch 1" in n for n in report["notes"])
    assert "not at 1" not in json.dumps(report["dynamic_range"]), report["dynamic_range"]
    grid = [{"pixel_values": [[b, 3, 32, 32], "float"]} for b in (1, 2, 5)]
    result = _fresh(out, directory, "SwinForImageClassification", grid)
    assert [r[0] for r in result["results"]] == ["match"] * 3, result


@pytest.mark.slow
def test_axes_whose_export_runs_too_long_are_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SAM2 with --dynamic-batch: torch.export's reasoning over its height and width kept sympy
    busy for over 15 minutes (with a dynamic batch alone: seconds), and the conversion never
    finished. Past ``AXES_SECONDS`` the family's axes are given up, exported at the example's
    sizes, and said so."""
    from ptconvert.convert import exporting

    monkeypatch.setattr(exporting, "AXES_SECONDS", 5.0)
    directory = _save("sam2", tmp_path / "s")
    report = convert_program(
        directory, "pt2", tmp_path / "s.pt2", Options(dynamic_batch=True, cache=False)
    )
    assert report.parity is not None and report.parity.status == "pass"
    assert any("ran past 5 s" in n and "could not be dynamic" in n for n in report.notes)
    assert "pixel_values dim 0" in report.dynamic_range
    assert "pixel_values dim 2" not in report.dynamic_range, report.dynamic_range


def test_plan_names_the_family_axes_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _save("t5", tmp_path / "t5")
    code, plan, _ = run_cli(["plan", str(directory), "--to", "onnx", "--dynamic-batch"], capsys)
    assert code == 0, plan
    assert plan["dynamic"]["decoder_sequence_length"].startswith("dim 1 of decoder_input_ids")
    directory = _save("wav2vec2", tmp_path / "w")
    code, plan, _ = run_cli(["plan", str(directory), "--to", "pt2", "--dynamic-batch"], capsys)
    assert "20 samples or more" in plan["dynamic"]["sequence_length"], plan


def test_the_token_inputs_share_one_batch(tmp_path: Path) -> None:
    """Llama does not force its mask's batch to be the ids': torch gave them two symbols, and
    an AOTInductor package given one mask row for two rows of ids aborted the process. One
    batch_size now: the program refuses it, as optimum's files do by their shared dim."""
    from fixtures.build import _more_hf_models

    config, cls = _more_hf_models()["llama"]
    torch.manual_seed(0)
    cls(config).eval().save_pretrained(tmp_path / "llama")
    out = tmp_path / "l.pt2"
    convert_program(tmp_path / "llama", "pt2", out, Options(dynamic_batch=True, cache=False))
    program = torch.export.load(out).module()
    ids = torch.randint(0, 90, (2, 7))
    with pytest.raises(Exception, match=r"attention_mask.size\(\)\[0\] == input_ids.size\(\)\[0\]"):
        program(input_ids=ids, attention_mask=torch.ones(1, 7, dtype=torch.int64))
    ones = torch.ones(3, 5, dtype=torch.int64)
    assert (
        program(input_ids=ids[:1].repeat(3, 1)[:, :5], attention_mask=ones)["logits"].shape[0] == 3
    )


@pytest.mark.slow
def test_an_aoti_package_fixes_the_image_size_inductor_cannot_keep_dynamic(
    tmp_path: Path,
) -> None:
    """SegFormer's height and width are dynamic in its .pt2, but Inductor cannot lower its
    strided conv over them ("Invalid ranges"): the AOTI conversion failed (exit 4). The package
    now takes the example's size, says so, and refuses others."""
    directory = _save("segformer", tmp_path / "s")
    out = tmp_path / "s.aoti.pt2"
    report = convert_program(directory, "aoti", out, Options(dynamic_batch=True, cache=False))
    assert any("could not stay dynamic in the package" in n for n in report.notes), report.notes
    runner = torch._inductor.aoti_load_package(str(out))
    model = _reference("segformer", directory)
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(runner(pixel_values=x)["logits"], model(pixel_values=x).logits)
    with pytest.raises(Exception, match="unmatched dim value"):
        runner(pixel_values=torch.randn(1, 3, 48, 48))


def _reference(kind: str, directory: Path) -> torch.nn.Module:
    import transformers

    auto = {"segformer": transformers.AutoModelForSemanticSegmentation}[kind]
    return auto.from_pretrained(directory).eval()


@pytest.mark.slow
def test_an_aoti_package_with_one_batch_size_takes_batch_1(tmp_path: Path) -> None:
    """The token inputs' shared batch_size is declared from 1; the package's input checks put
    torch's floor of 2 on it and refused batch 1, which the .pt2 and ONNX files take."""
    from transformers import BertModel

    from fixtures.build import _tiny_bert_config

    torch.manual_seed(0)
    BertModel(_tiny_bert_config()).eval().save_pretrained(tmp_path / "bert")
    out = tmp_path / "b.aoti.pt2"
    convert_program(tmp_path / "bert", "aoti", out, Options(dynamic_batch=True, cache=False))
    runner = torch._inductor.aoti_load_package(str(out))
    model = BertModel.from_pretrained(tmp_path / "bert").eval()
    for batch in (1, 3):
        ids = torch.randint(0, 90, (batch, 7))
        mask, types = torch.ones_like(ids), ids % 2  # BERT's segment ids: an input too
        got = runner(input_ids=ids, attention_mask=mask, token_type_ids=types)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        torch.testing.assert_close(
            got["last_hidden_state"], want.last_hidden_state, rtol=1e-4, atol=1e-4
        )
    with pytest.raises(Exception, match="must equal input_ids dim 0"):
        wrong = torch.ones(2, 7, dtype=torch.int64)
        runner(input_ids=ids, attention_mask=wrong, token_type_ids=types)
