"""SentencePiece tokenizers (ERNIE-4.5 ships tokenizer.model, no tokenizer.json) against transformers
5, which converts the .model to a `tokenizers` BPE (TokenizersBackend, as it does for ernie4_5_moe):
ids on a seeded corpus with ERNIE's special tokens inside, decode of random ids (special tokens
skipped or not), streaming pieces, and the ERNIE chat template through apply_chat_template. Models
are BPE with byte fallback trained here by the sentencepiece package, in the three normalizer and
`legacy` combinations that change how chunks between added tokens get the dummy prefix."""
import json
import random
import re
import shutil
import unicodedata

import pytest
from transformers import AutoTokenizer

import chat_corpus
import tokenizer_corpus
from test_checkpoints import REPO
from test_chat_template import hf_render, ours
from test_tokenizer import run_tool

# ERNIE-4.5's special tokens, by name and order as transformers' Ernie4_5TokenizerFast defaults them.
SPECIALS = ["<unk>", "<s>", "</s>", "<|begin_of_sentence|>", "<|end_of_sentence|>", "<mask:1>"]


def make_tokenizer(path, texts, legacy: bool, dummy_prefix: bool):
    import sentencepiece as spm
    # Trained on the texts of common scripts only: rarer characters meet the byte fallback.
    common = [t for t in texts if all(ord(c) < 0x2000 or 0x4E00 <= ord(c) < 0xA000 for c in t)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(common), model_prefix=str(path / "tokenizer"), vocab_size=8000, model_type="bpe",
        byte_fallback=True, character_coverage=0.9995, hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        control_symbols=SPECIALS[3:], add_dummy_prefix=dummy_prefix, num_threads=1, minloglevel=2)
    (path / "tokenizer.vocab").unlink()
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, t in enumerate(SPECIALS)}
    config = {"added_tokens_decoder": added, "legacy": legacy, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<unk>", "cls_token": "<|begin_of_sentence|>",
              "sep_token": "<|end_of_sentence|>", "mask_token": "<mask:1>", "clean_up_tokenization_spaces": False,
              "add_bos_token": False, "add_eos_token": False}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "config.json").write_text(json.dumps({"model_type": "ernie4_5_moe"}))  # transformers' ERNIE route
    shutil.copy(REPO / "data/ernie/chat_template.jinja", path / "chat_template.jinja")
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def strings():
    seed = random.SystemRandom().randrange(2**31)
    print(f"[seed] tokenizer corpus: {seed}")
    rng = random.Random(seed)
    corpus = tokenizer_corpus.corpus(seed)
    # ERNIE's added tokens inside text, at the start, the end, with spaces around them.
    for _ in range(500):
        a, b = rng.choice(corpus), rng.choice(corpus)
        corpus.append(rng.choice(["", " ", "\n"]).join([a, rng.choice(SPECIALS), b]))
    corpus += [t + "x" for t in SPECIALS] + [" " + t for t in SPECIALS] + ["<|begin_of_sentence|>User: hi\nAssistant: "]
    return corpus


@pytest.fixture(scope="module", params=[(True, True), (False, True), (True, False)],
                ids=["legacy", "not-legacy", "no-dummy-prefix"])
def tokenizer(request, strings, tmp_path_factory):
    legacy, dummy_prefix = request.param
    path = tmp_path_factory.mktemp("spm")
    # SentencePiece's own encoding prefixes every chunk, as transformers' legacy mode does.
    return path, make_tokenizer(path, strings[:3000], legacy, dummy_prefix), legacy or not dummy_prefix


def is_exotic(s: str) -> bool:
    """Combining marks, control and format characters (but tab and line breaks), unassigned and
    private-use code points, U+FFFD, spaces and separators other than U+0020 (NBSP, ideographic space,
    the U+2028 / U+2029 line and paragraph separators: for "\u2028ᾅ" nibble and SentencePiece give a
    dummy-prefix piece first, the not-legacy transformers tokenizer none), and the meta-space U+2581
    itself: `tokenizers`' Metaspace pre-tokenizer (prepend_scheme "first") adds no dummy prefix to a
    text that already starts with it, where SentencePiece (and nibble) always do — "▁钱f" gave nibble
    an extra "▁" piece first (a CI run of 2026-12-03)."""
    return any(unicodedata.category(c)[0] == "M" or (unicodedata.category(c)[0] == "C" and c not in "\t\n\r")
               or (unicodedata.category(c)[0] == "Z" and c != " ") or c in "\ufffd\u2581" for c in s)


def test_encode_matches_sentencepiece_and_transformers(build_dir, strings, tokenizer):
    """Ids equal SentencePiece's own on every string, and transformers' on every string without
    exotic characters: around combining marks (e.g. "ẛ̣", a lone U+0301), non-ASCII spaces and
    characters the normalizer drops, the `tokenizers` Precompiled normalizer that transformers converts to differs
    from SentencePiece's own, and nibble follows SentencePiece (the tokenizer ERNIE was trained and is
    served with)."""
    import sentencepiece as spm
    path, hf, prefixes_like_sentencepiece = tokenizer
    sample = strings[3000:]
    ours_ids = run_tool(build_dir, "encode", sample, tokenizer=path)
    sp = spm.SentencePieceProcessor(model_file=str(path / "tokenizer.model"))
    special = {t: i for i, t in enumerate(SPECIALS)}
    pattern = re.compile("(" + "|".join(re.escape(t) for t in SPECIALS) + ")")
    theirs_sp = [[i for part in pattern.split(s) if part
                  for i in ([special[part]] if part in special else sp.encode(part, add_bos=False))] for s in sample]
    theirs_hf = hf(sample, add_special_tokens=False)["input_ids"]
    assert len(sample) > 7000
    if prefixes_like_sentencepiece:
        bad = [(s, o, t) for s, o, t in zip(sample, ours_ids, theirs_sp) if o != t]
        assert not bad, f"vs sentencepiece: {len(bad)} of {len(sample)} differ; first: {bad[0]!r}"
    plain = [(s, o, t) for s, o, t in zip(sample, ours_ids, theirs_hf) if not is_exotic(s)]
    bad = [(s, o, t) for s, o, t in plain if o != t]
    assert len(plain) > 1500
    assert not bad, f"vs transformers: {len(bad)} of {len(plain)} differ; first: {bad[0]!r}"
    exotic = sum(o != t for s, o, t in zip(sample, ours_ids, theirs_hf) if is_exotic(s))
    print(f"strings with exotic characters that transformers encodes differently: {exotic}")
    assert any(3 in ids for ids in ours_ids) and any(hf.unk_token_id != i for ids in ours_ids for i in ids)


def test_decode_and_streaming_match_transformers(build_dir, tokenizer, seed):
    path, hf, _ = tokenizer
    rng = random.Random(seed)
    seqs = [[rng.randrange(len(hf)) for _ in range(rng.randint(1, 12))] for _ in range(3000)]
    seqs += run_tool(build_dir, "encode", ["  two leading", "x", " <s> y", "\n\nz"], tokenizer=path)
    for mode, skip in (("decode", False), ("decode-skip", True)):
        ours_text = run_tool(build_dir, mode, seqs, tokenizer=path)
        theirs = hf.batch_decode(seqs, skip_special_tokens=skip)
        bad = [(s, o, t) for s, o, t in zip(seqs, ours_text, theirs) if o != t]
        assert not bad, f"{mode}: {len(bad)} differ; first: {bad[0]!r}"
    pieces = run_tool(build_dir, "stream", seqs, tokenizer=path)
    full = hf.batch_decode(seqs, skip_special_tokens=False)
    for ids, p, f in zip(seqs, pieces, full):
        assert "".join(p) == f, (ids, p, f)


def test_ernie_chat_template_matches_transformers(build_dir, tokenizer):
    path, hf, _ = tokenizer
    seed = random.SystemRandom().randrange(2**31)
    print(f"[seed] chat corpus: {seed}")
    requests = chat_corpus.requests(seed)
    expected = [hf_render(hf, r) for r in requests]
    got = ours(build_dir, path, requests)
    assert sum("prompt" in e for e in expected) >= 50
    for r, e, g in zip(requests, expected, got):
        assert g.get("prompt") == e.get("prompt"), f"request {json.dumps(r)}\nnibble: {g!r}\nhf: {e!r}"
    assert expected[0]["prompt"].startswith("<|begin_of_sentence|>")


def test_a_converted_tokenizer_json_beside_the_model(build_dir, strings, tokenizer, tmp_path):
    """transformers saves a SentencePiece tokenizer as tokenizer.json (byte-fallback BPE, Metaspace);
    with the tokenizer.model beside it nibble reads the model and gives the same ids."""
    path, hf, prefixes_like_sentencepiece = tokenizer
    hf.save_pretrained(str(tmp_path))
    assert (tmp_path / "tokenizer.json").exists()
    shutil.copy(path / "tokenizer.model", tmp_path / "tokenizer.model")
    shutil.copy(path / "chat_template.jinja", tmp_path / "chat_template.jinja")
    saved = AutoTokenizer.from_pretrained(str(tmp_path))
    sample = [s for s in strings[3000:6000] if not is_exotic(s)]
    ours_ids = run_tool(build_dir, "encode", sample, tokenizer=tmp_path)
    theirs = saved(sample, add_special_tokens=False)["input_ids"]
    bad = [(s, o, t) for s, o, t in zip(sample, ours_ids, theirs) if o != t]
    assert not bad, f"{len(bad)} of {len(sample)} differ; first: {bad[0]!r}"
