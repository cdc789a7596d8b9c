"""Example inputs: the ``--input`` grammar, inputs derived from transformers models of every
modality (each model really runs on them at batch 1, 2 and 3), and naming missing inputs.

The transformers models are built from tiny configs with random weights (no hub access).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ptconvert.errors import MissingRequirementError, UsageError
from ptconvert.model.hf_inputs import from_hf_model
from ptconvert.model.inputs import (
    ExampleInputs,
    InputSpec,
    check_provided,
    from_file,
    from_specs,
    parse_input,
    pinned,
    required_inputs,
    resize_batch,
)

# --- the --input grammar -------------------------------------------------------------------


def test_plain_spec_as_today() -> None:
    spec = parse_input("x:2x3x8x8:float32")
    assert spec == InputSpec("x", (2, 3, 8, 8), "float32")
    assert spec.batched and not spec.scalar
    inputs = from_specs([spec, parse_input("input_ids:2x16:int64")])
    assert inputs.batch == 2
    out = inputs.at(3)
    assert out["x"].shape == (3, 3, 8, 8) and out["x"].dtype == torch.float32
    assert out["input_ids"].shape == (3, 16) and out["input_ids"].dtype == torch.int64
    assert int(out["input_ids"].min()) >= 0 and int(out["input_ids"].max()) < 100


def test_integer_range() -> None:
    spec = parse_input("labels:64:int64:3:7")
    assert (spec.low, spec.high) == (3, 7)
    assert isinstance(spec.low, int) and isinstance(spec.high, int)
    inputs = from_specs([spec])
    for b in (1, 64, 500):
        t = inputs.at(b)["labels"]
        assert t.shape == (b,) and t.dtype == torch.int64
        assert int(t.min()) >= 3 and int(t.max()) < 7
    assert set(inputs.at(500)["labels"].tolist()) == {3, 4, 5, 6}  # the whole range, no more


def test_negative_integer_range() -> None:
    t = from_specs([parse_input("offsets:200:int32:-5:-1")]).at(200)["offsets"]
    assert t.dtype == torch.int32 and set(t.tolist()) == {-5, -4, -3, -2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_float_range(dtype: str) -> None:
    spec = parse_input(f"x:4x256:{dtype}:-1.5:0.25")
    assert (spec.low, spec.high) == (-1.5, 0.25)
    t = from_specs([spec]).at(4)["x"]
    assert t.dtype == getattr(torch, dtype) and t.shape == (4, 256)
    assert float(t.min()) >= -1.5 and float(t.max()) < 0.25
    assert float(t.max()) - float(t.min()) > 1.0  # spread over the range, not a constant


def test_narrow_float_range_stays_open() -> None:
    # rounding to float16 would reach HIGH for values just below it
    t = from_specs([parse_input("x:8x4096:float16:0:0.001")]).at(8)["x"]
    assert float(t.min()) >= 0 and float(t.max()) < 0.001


def test_constant_tensor() -> None:
    inputs = from_specs([parse_input("labels:2:int64:=1"), parse_input("mask:2x16:bool:=1")])
    assert inputs.batch == 2
    for b in (1, 2, 5):
        out = inputs.at(b)
        assert out["labels"].shape == (b,) and out["labels"].dtype == torch.int64
        assert out["labels"].tolist() == [1] * b
        assert out["mask"].shape == (b, 16) and out["mask"].dtype == torch.bool
        assert bool(out["mask"].all())
    scale = from_specs([parse_input("scale:3x2:float32:=-0.5")]).at(3)["scale"]
    assert torch.equal(scale, torch.full((3, 2), -0.5))
    assert not bool(from_specs([parse_input("m:2:bool:=false")]).at(2)["m"].any())


def test_scalars_are_plain_values() -> None:
    specs = [
        parse_input("sr::int64=16000"),
        parse_input("alpha::float32=0.5"),
        parse_input("flag::bool=1"),
        parse_input("x:4x3:float32"),
    ]
    assert specs[0] == InputSpec("sr", (), "int64", value=16000)
    assert specs[0].scalar and not specs[0].batched
    inputs = from_specs(specs)
    assert inputs.batch == 4  # the first batched tensor's dim 0, not the scalar
    for b in (1, 2, 7):
        out = inputs.at(b)
        assert type(out["sr"]) is int and out["sr"] == 16000
        assert type(out["alpha"]) is float and out["alpha"] == 0.5
        assert out["flag"] is True
        assert out["x"].shape == (b, 3)
    assert from_specs([parse_input("n::int32=-3")]).at(1)["n"] == -3
    assert from_specs([parse_input("flag::bool=false")]).at(1)["flag"] is False
    assert from_specs([parse_input("n::int64=1")]).batch == 1  # only scalars: batch 1


def test_scalar_needs_a_value() -> None:
    with pytest.raises(UsageError, match="scalar needs a value") as err:
        parse_input("sr::int64")
    assert "sr::int64=VALUE" in str(err.value)
    with pytest.raises(UsageError, match="scalar needs a value"):
        from_specs([InputSpec("sr", (), "int64")])


@pytest.mark.parametrize(
    "text",
    [
        "x",
        "x:2x3",
        "2x:3:float32",
        "x:2,3:float32",
        "x:2x3:float32:1",
        "x:2x3:float32:0:1:2",
        "x:2x3:float32=1",
        "x:2x3:float32:=",
        "x:2x3:int64:0:1.5",
        "x:2x3:int64:5:5",
        "x:2x3:float32:1:-1",
        "x:2x3:int64:=one",
        "flag::bool=maybe",
        "sr::int64=1.5",
        "sr::=3",
    ],
)
def test_bad_text_names_it_and_shows_the_grammar(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_input(text)
    message = str(err.value)
    assert repr(text) in message
    assert "NAME:SHAPE:DTYPE" in message and "NAME::DTYPE=VALUE" in message
    assert "x:2x3x224x224:float32" in message  # with examples
    assert err.value.exit_code == 2


@pytest.mark.parametrize("text", ["x:2x3:flaot32", "sr::integer=3", "x:2:Tensor:=1"])
def test_unknown_dtype_is_named(text: str) -> None:
    bad = text.split(":")[2].split("=")[0]
    with pytest.raises(UsageError, match=f"unknown dtype {bad!r}"):
        parse_input(text)
    with pytest.raises(UsageError, match="unknown dtype 'flaot32'"):
        from_specs([InputSpec("x", (2,), "flaot32")])


def test_range_must_fit_the_dtype() -> None:
    with pytest.raises(UsageError, match="does not fit uint8"):
        from_specs([parse_input("x:2:uint8:0:300")])


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(UsageError, match="x more than once"):
        from_specs([parse_input("x:2:float32"), parse_input("x:2:int64")])


def test_seeded_and_reproducible() -> None:
    specs = [parse_input("x:2x5:float32"), parse_input("ids:2x7:int64:0:1000")]
    first, again = from_specs(specs, seed=3), from_specs(specs, seed=3)
    for b in (1, 2, 3):
        a, c = first.at(b), again.at(b)
        assert torch.equal(a["x"], c["x"]) and torch.equal(a["ids"], c["ids"])
        assert torch.equal(a["x"], first.at(b)["x"])  # same batch → same tensors, every call
    assert not torch.equal(first.at(2)["x"], from_specs(specs, seed=4).at(2)["x"])


def test_the_example_keeps_each_shape_given_and_pinned_inputs_keep_it_at_every_batch() -> None:
    """``table`` [10, 4] is no batch: at the example's batch it has its own 10 rows (it had x's
    2), and once pinned it keeps them (and its values) at every other batch."""
    inputs = from_specs([parse_input("x:2x8:float32"), parse_input("table:10x4:float32")])
    example = inputs.at(2)
    assert example["x"].shape == (2, 8) and example["table"].shape == (10, 4)
    assert inputs.at(3)["table"].shape == (3, 4)  # not known to be unbatched: resized
    fixed = pinned(inputs, ["table"])
    at3 = fixed.at(3)
    assert at3["x"].shape == (3, 8) and torch.equal(at3["table"], example["table"])
    assert list(at3) == ["x", "table"] and torch.equal(fixed.at(2)["x"], example["x"])
    assert pinned(inputs, ["absent"]) is inputs


def test_resize_batch_keeps_scalars() -> None:
    t = torch.arange(6).reshape(2, 3)
    assert torch.equal(resize_batch(t, 3), torch.cat([t, t[:1]]))
    assert torch.equal(resize_batch(t, 1), t[:1])
    zero_dim = torch.tensor(2.5)
    assert resize_batch(zero_dim, 4) is zero_dim
    for value in (16000, 0.5, True, None, "text"):
        assert resize_batch(value, 3) is value


def test_from_file_resizes_tensors_and_keeps_0dim(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "inputs.safetensors"
    x = torch.randn(2, 4)
    save_file({"scale": torch.tensor(3.0), "x": x}, str(path))
    inputs = from_file(path)
    assert inputs.batch == 2  # the first batched tensor, not the 0-dim one
    out = inputs.at(3)
    assert torch.equal(out["x"], torch.cat([x, x[:1]]))
    assert float(out["scale"]) == 3.0 and out["scale"].dim() == 0


# --- inputs of transformers models -----------------------------------------------------------


def _tf() -> Any:
    """transformers (an optional dependency): the tests that need it skip without it."""
    return pytest.importorskip("transformers")


# special token ids inside the tiny vocabularies (transformers warns on ids outside them)
_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_TEXT = {
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
    **_TOKENS,
}
_VISION = {
    "image_size": 16,
    "patch_size": 8,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}


def bert() -> Any:
    return _tf().BertModel(_tf().BertConfig(**_TEXT))


def gpt2() -> Any:
    config = _tf().GPT2Config(
        vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32, **_TOKENS
    )
    return _tf().GPT2LMHeadModel(config)


def t5() -> Any:
    config = _tf().T5Config(
        vocab_size=50,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        decoder_start_token_id=0,
        **_TOKENS,
    )
    return _tf().T5ForConditionalGeneration(config)


def whisper() -> Any:
    config = _tf().WhisperConfig(
        vocab_size=60,
        num_mel_bins=8,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_source_positions=10,
        max_target_positions=8,
        decoder_start_token_id=1,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        **_TOKENS,
    )
    return _tf().WhisperForConditionalGeneration(config)


def wav2vec2() -> Any:
    config = _tf().Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8),
        conv_kernel=(10, 3),
        conv_stride=(5, 2),
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
    )
    return _tf().Wav2Vec2Model(config)


def vit() -> Any:
    return _tf().ViTModel(_tf().ViTConfig(**_VISION))


def blip() -> Any:
    text = {**_TEXT, "encoder_hidden_size": 16, "sep_token_id": 3}
    vision = {**_VISION, "image_size": 24}  # not the text side's size: read from vision_config
    config = _tf().BlipConfig(text_config=text, vision_config=vision, projection_dim=16)
    return _tf().BlipForConditionalGeneration(config)


def clip() -> Any:
    config = _tf().CLIPConfig(text_config=_TEXT, vision_config=_VISION, projection_dim=16)
    return _tf().CLIPModel(config)


def sam2() -> Any:
    backbone = _tf().Sam2HieraDetConfig(
        hidden_size=8,
        image_size=64,
        blocks_per_stage=[1, 1, 1, 1],
        embed_dim_per_stage=[8, 16, 24, 32],
        num_attention_heads_per_stage=[1, 1, 1, 1],
        global_attention_blocks=[],
        window_size_per_stage=[4, 4, 4, 4],
    )
    vision = _tf().Sam2VisionConfig(
        backbone_config=backbone,
        backbone_channel_list=[32, 24, 16, 8],
        backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]],  # 64 / 4, then halved twice
        fpn_hidden_size=16,
    )
    prompt = _tf().Sam2PromptEncoderConfig(
        image_size=64, patch_size=16, hidden_size=16, mask_input_channels=4
    )
    decoder = _tf().Sam2MaskDecoderConfig(
        hidden_size=16, mlp_dim=32, num_hidden_layers=1, num_attention_heads=2,
        iou_head_hidden_dim=16,
    )  # fmt: skip
    config = _tf().Sam2Config(
        vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder
    )
    return _tf().Sam2Model(config)


def sam() -> Any:
    vision = _tf().SamVisionConfig(
        image_size=32,
        patch_size=8,
        hidden_size=16,
        output_channels=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        mlp_dim=32,
        global_attn_indexes=[0],
        num_pos_feats=8,
        window_size=2,
    )
    prompt = _tf().SamPromptEncoderConfig(
        image_size=32, patch_size=8, hidden_size=16, mask_input_channels=4
    )
    decoder = _tf().SamMaskDecoderConfig(
        hidden_size=16, mlp_dim=32, num_hidden_layers=1, num_attention_heads=2,
        iou_head_hidden_dim=16,
    )  # fmt: skip
    config = _tf().SamConfig(
        vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder
    )
    return _tf().SamModel(config)


def vision_encoder_decoder() -> Any:
    decoder = _tf().GPT2Config(
        vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=32, **_TOKENS,
        add_cross_attention=True, is_decoder=True,
    )  # fmt: skip
    config = _tf().VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        _tf().ViTConfig(**_VISION), decoder
    )
    return _tf().VisionEncoderDecoderModel(config)


def llava() -> Any:
    text = {**_TEXT, "model_type": "llama", "vocab_size": 64, "num_key_value_heads": 2}
    vision = {**_VISION, "model_type": "clip_vision_model", "projection_dim": 16}
    config = _tf().LlavaConfig(text_config=text, vision_config=vision, image_token_index=60)
    return _tf().LlavaForConditionalGeneration(config)


def _ids(vocab: int, seq: int) -> Callable[[dict[str, Any], int], None]:
    def check(out: dict[str, Any], b: int) -> None:
        for name in [n for n in out if n.endswith("input_ids")]:
            t = out[name]
            assert t.dtype == torch.int64 and t.shape[0] == b
            assert int(t.min()) >= 0 and int(t.max()) < vocab  # inside the text vocabulary
        if "input_ids" in out:
            assert out["input_ids"].shape == (b, seq)

    return check


def _mask(out: dict[str, Any], b: int) -> None:
    mask = out["attention_mask"]
    assert mask.shape == out["input_ids"].shape and mask.dtype == torch.int64
    if b == 1:
        assert bool((mask == 1).all())
    else:  # padding at the end of the last row only
        assert bool((mask[:-1] == 1).all())
        assert mask[-1].tolist() == [1] * (mask.shape[1] - 2) + [0, 0]


def _image(size: int) -> Callable[[dict[str, Any], int], None]:
    def check(out: dict[str, Any], b: int) -> None:
        assert out["pixel_values"].shape == (b, 3, size, size)
        assert out["pixel_values"].dtype == torch.float32

    return check


def _points(size: int) -> Callable[[dict[str, Any], int], None]:
    def check(out: dict[str, Any], b: int) -> None:
        points, labels = out["input_points"], out["input_labels"]
        assert points.shape == (b, 1, 1, 2) and points.dtype == torch.float32
        assert float(points.min()) >= 0 and float(points.max()) < size
        assert labels.shape == (b, 1, 1) and bool((labels == 1).all())  # a foreground point

    return check


def _features(out: dict[str, Any], b: int) -> None:
    # Whisper needs exactly 2 × max_source_positions frames of num_mel_bins
    assert out["input_features"].shape == (b, 8, 20)


def _waveform(out: dict[str, Any], b: int) -> None:
    # (((8 - 1) * 2 + 3) - 1) * 5 + 10: just long enough for 8 frames out of the convs
    assert out["input_values"].shape == (b, 90)


CASES: dict[str, tuple[Callable[[], Any], set[str], list[Callable[[dict[str, Any], int], None]]]]
CASES = {
    "bert": (bert, {"input_ids", "attention_mask", "token_type_ids"}, [_ids(50, 16), _mask]),
    "gpt2": (gpt2, {"input_ids", "attention_mask"}, [_ids(50, 16), _mask]),
    "t5": (t5, {"input_ids", "attention_mask", "decoder_input_ids"}, [_ids(50, 16), _mask]),
    "whisper": (whisper, {"input_features", "decoder_input_ids"}, [_features, _ids(60, 4)]),
    "wav2vec2": (wav2vec2, {"input_values"}, [_waveform]),
    "vit": (vit, {"pixel_values"}, [_image(16)]),
    "blip": (
        blip,
        {"pixel_values", "input_ids", "attention_mask"},
        [_image(24), _ids(50, 16), _mask],
    ),
    "clip": (
        clip,
        {"input_ids", "pixel_values", "attention_mask"},
        [_image(16), _ids(50, 16), _mask],
    ),
    "sam2": (sam2, {"pixel_values", "input_points", "input_labels"}, [_image(64), _points(64)]),
    "sam": (sam, {"pixel_values", "input_points", "input_labels"}, [_image(32), _points(32)]),
    "vision_encoder_decoder": (
        vision_encoder_decoder,
        {"pixel_values", "decoder_input_ids"},
        [_image(16), _ids(40, 4)],
    ),
    # a vision-language model whose text must hold image tokens: called text-only
    "llava": (llava, {"input_ids", "attention_mask"}, [_ids(64, 16), _mask]),
}


def _run(model: Any, inputs: ExampleInputs) -> list[Any]:
    outs = []
    for b in (1, 2, 3):
        with torch.no_grad():
            outs.append(model(**inputs.at(b)))
    return outs


@pytest.mark.parametrize("case", list(CASES))
def test_hf_model_runs_on_its_inputs(case: str) -> None:
    build, names, checks = CASES[case]
    if case == "sam2" and not hasattr(_tf(), "Sam2Model"):
        pytest.skip("this transformers has no Sam2Model")
    torch.manual_seed(0)
    model = build().eval()
    inputs = from_hf_model(model)
    assert inputs.batch == 2
    accepted = set(inspect.signature(model.forward).parameters)
    for b in (1, 2, 3):
        out = inputs.at(b)
        assert set(out) == names and names <= accepted
        for check in checks:
            check(out, b)
        again = inputs.at(b)  # seeded: the same batch gives the same tensors
        assert all(torch.equal(out[k], again[k]) for k in out)
    results = _run(model, inputs)
    if case == "wav2vec2":  # a few frames really come out of the feature extractor
        assert results[0].last_hidden_state.shape[:2] == (1, 8)
    if case in ("sam", "sam2"):
        assert results[2].pred_masks.shape[:2] == (3, 1)  # one mask set per point prompt


def _resnet() -> Any:
    config = _tf().ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])
    return _tf().ResNetModel(config).eval()


def test_image_size_from_the_preprocessor_config(tmp_path: Path) -> None:
    model = _resnet()  # its config has no image size
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"do_center_crop": True, "crop_size": {"height": 24, "width": 20}})
    )
    inputs = from_hf_model(model, tmp_path)
    assert inputs.at(2)["pixel_values"].shape == (2, 3, 24, 20)
    _run(model, inputs)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"shortest_edge": 28}}))
    assert from_hf_model(model, tmp_path).at(1)["pixel_values"].shape == (1, 3, 28, 28)


class _Speech(torch.nn.Module):
    """A speech model whose config leaves the feature sizes to preprocessor_config.json."""

    def __init__(self, main: str, **config: Any) -> None:
        super().__init__()
        self.main_input_name = main
        self.config = SimpleNamespace(**config)

    def forward(self, input_features: Any = None, input_values: Any = None) -> Any:
        return input_features if input_values is None else input_values


def test_audio_sizes_from_the_preprocessor_config(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"feature_size": 8, "sampling_rate": 1600})
    )
    mel = from_hf_model(_Speech("input_features", max_source_positions=10), tmp_path)
    assert set(mel.at(1)) == {"input_features"}
    assert mel.at(1)["input_features"].shape == (1, 8, 20)  # mel bins × 2·max_source_positions
    wave = from_hf_model(_Speech("input_values"), tmp_path)
    assert set(wave.at(3)) == {"input_values"}
    assert wave.at(3)["input_values"].shape == (3, 1600)  # one second at the sampling rate
    with pytest.raises(MissingRequirementError, match="'input_values'") as err:
        from_hf_model(_Speech("input_values"))  # nothing tells the length
    assert err.value.hint == "pass --input input_values:2xSAMPLES:float32"


def test_underivable_required_input_names_it_with_the_input_line(tmp_path: Path) -> None:
    with pytest.raises(MissingRequirementError) as err:
        from_hf_model(_resnet(), tmp_path)  # no image size anywhere
    assert "'pixel_values'" in err.value.message
    assert err.value.hint == "pass --input pixel_values:2x3xHxW:float32"
    assert err.value.path == str(tmp_path)


class _Odd(torch.nn.Module):
    """A model with a required argument that no config describes."""

    main_input_name = "input_ids"

    def __init__(self) -> None:
        super().__init__()
        self.config = _tf().BertConfig(**_TEXT)

    def forward(self, input_ids: Any, boxes: Any, extra: Any = None) -> Any:
        return input_ids


def test_unknown_required_input_is_named() -> None:
    with pytest.raises(MissingRequirementError, match="'boxes'") as err:
        from_hf_model(_Odd())
    assert err.value.hint == "pass --input boxes:SHAPE:DTYPE"


def test_unknown_optional_input_is_left_out() -> None:
    model = bert().eval()
    out = from_hf_model(model).at(2)
    assert "position_ids" not in out and "head_mask" not in out


def test_segment_ids_are_an_input_where_the_model_has_token_types() -> None:
    """BERT's token_type_ids (issue 40: dropped, sentence pairs gave other logits than eager
    once a client passed them): an input of every artifact, fed both segment ids; a model with
    one token type leaves it out, as optimum does."""
    model = bert().eval()
    assert model.config.type_vocab_size > 1
    out = from_hf_model(model).at(4)
    types = out["token_type_ids"]
    assert types.shape == out["input_ids"].shape and set(types.unique().tolist()) == {0, 1}
    model.config.type_vocab_size = 1
    assert "token_type_ids" not in from_hf_model(model).at(2)


# --- naming missing inputs -----------------------------------------------------------------


def _fn(
    x: torch.Tensor, sr: int, alpha: float, flag: bool, y: Any = None, *a: Any, **k: Any
) -> Any:
    return x


class _Scripted(torch.nn.Module):
    def forward(self, x: torch.Tensor, sr: int, alpha: float, scale: float = 1.0) -> torch.Tensor:
        return x * sr * alpha * scale


def test_required_inputs_of_a_callable_and_a_module() -> None:
    assert required_inputs(_fn) == ["x", "sr", "alpha", "flag"]
    assert required_inputs(_Scripted()) == ["x", "sr", "alpha"]
    assert required_inputs(_Scripted.forward) == ["x", "sr", "alpha"]  # unbound: no self
    assert required_inputs(lambda: 0) == []


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_required_inputs_of_torchscript() -> None:
    scripted = torch.jit.script(_Scripted())
    assert required_inputs(scripted) == ["x", "sr", "alpha"]
    hint = _missing_hint(required_inputs(scripted), {})
    assert "--input x:SHAPE:DTYPE" in hint
    assert "--input sr::int64=VALUE" in hint and "--input alpha::float32=VALUE" in hint


def _missing_hint(required: list[str], provided: dict[str, Any]) -> str:
    with pytest.raises(MissingRequirementError) as err:
        check_provided(required, provided, Path("model.pt"))
    assert err.value.hint is not None
    return err.value.hint


def test_check_provided() -> None:
    required = required_inputs(_fn)
    check_provided(required, {"x": 1, "sr": 2, "alpha": 0.5, "flag": True}, None)  # all there
    with pytest.raises(MissingRequirementError) as err:
        check_provided(required, {"x": torch.zeros(1), "alpha": 0.5}, Path("m.pt2"))
    assert "'sr'" in err.value.message and "'flag'" in err.value.message
    assert "'x'" not in err.value.message.split("(")[0]  # only the missing ones are named
    assert err.value.path == "m.pt2" and err.value.exit_code == 5
    assert err.value.hint == "pass --input sr::int64=VALUE --input flag::bool=VALUE"
    # plain names (no annotation known): a tensor line
    assert _missing_hint(["pixel_values"], {}) == "pass --input pixel_values:SHAPE:DTYPE"
    # the hinted scalar line, once filled in, parses to what was missing
    assert parse_input("sr::int64=16000").value == 16000
