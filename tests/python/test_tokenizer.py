"""nibble's tokenizer against Hugging Face `tokenizers` with the real Qwen3 tokenizer.json: ids on a
corpus of ≥ 10,000 strings (special tokens parsed and not), decode round trip equal to the NFC of
the input, decode of random id sequences (incl. partial UTF-8 and special tokens, skipped or not),
and the streaming detokenizer's pieces concatenating to decode(all ids)."""
import json
import random
import subprocess
import unicodedata

import pytest
from tokenizers import Tokenizer

from test_checkpoints import REPO
import tokenizer_corpus

TOKENIZER = REPO / "data/qwen3-tokenizer/tokenizer.json"


def run_tool(build_dir, mode, values, tokenizer=TOKENIZER):
    text = "\n".join(json.dumps(v) for v in values) + "\n"
    proc = subprocess.run([str(build_dir / "tests/tokenizer_tool"), str(tokenizer), mode], input=text.encode(),
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()
    # split("\n"), not splitlines(): JSON output may hold raw U+2028 or U+0085, which are not breaks here.
    return [json.loads(line) for line in proc.stdout.decode().split("\n")[:-1]]


@pytest.fixture(scope="module")
def hf():
    return Tokenizer.from_file(str(TOKENIZER))


@pytest.fixture(scope="module")
def strings(request):
    seed = random.SystemRandom().randrange(2**31)
    print(f"[seed] tokenizer corpus: {seed}")
    return tokenizer_corpus.corpus(seed)


def test_encode_matches_hf(build_dir, hf, strings):
    assert len(strings) >= 10000
    ours = run_tool(build_dir, "encode", strings)
    theirs = [e.ids for e in hf.encode_batch(strings, add_special_tokens=False)]
    mismatches = [(s, o, t) for s, o, t in zip(strings, ours, theirs) if o != t]
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]!r}"


def test_encode_without_special_parsing_matches_hf(build_dir, strings):
    hf = Tokenizer.from_file(str(TOKENIZER))
    hf.encode_special_tokens = True
    sample = strings[:3000]
    ours = run_tool(build_dir, "encode-nospecial", sample)
    theirs = [e.ids for e in hf.encode_batch(sample, add_special_tokens=False)]
    mismatches = [(s, o, t) for s, o, t in zip(sample, ours, theirs) if o != t]
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]!r}"
    assert 151644 not in sum(ours, [])


def test_decode_round_trip_is_nfc(build_dir, strings):
    ids = run_tool(build_dir, "encode", strings)
    decoded = run_tool(build_dir, "decode", ids)
    bad = [(s, d) for s, d in zip(strings, decoded) if d != unicodedata.normalize("NFC", s)]
    assert not bad, f"{len(bad)} differ; first: {bad[0]!r}"


def test_decode_random_ids_matches_hf(build_dir, hf, seed):
    rng = random.Random(seed)
    seqs = [[rng.randrange(151669) for _ in range(rng.randint(1, 12))] for _ in range(3000)]
    for mode, skip in (("decode", False), ("decode-skip", True)):
        ours = run_tool(build_dir, mode, seqs)
        theirs = hf.decode_batch(seqs, skip_special_tokens=skip)
        bad = [(s, o, t) for s, o, t in zip(seqs, ours, theirs) if o != t]
        assert not bad, f"{mode}: {len(bad)} differ; first: {bad[0]!r}"


def test_streaming_pieces_concatenate_to_decode(build_dir, hf, strings, seed):
    rng = random.Random(seed)
    seqs = run_tool(build_dir, "encode", strings[:2000])
    seqs += [[rng.randrange(151669) for _ in range(rng.randint(1, 12))] for _ in range(1000)]
    pieces = run_tool(build_dir, "stream", seqs)
    full = hf.decode_batch(seqs, skip_special_tokens=False)
    for ids, p, f in zip(seqs, pieces, full):
        assert "".join(p) == f, (ids, p, f)
        # No piece but the last may end in a replacement character that decode does not have:
        # held-back bytes of an unfinished character are never emitted early.
        assert "".join(p[:-1]) == f[: len("".join(p[:-1]))]


def test_cli_tokenize_detokenize(build_dir, hf):
    text = "Hello <|im_start|>世界 😀"
    out = subprocess.run([str(build_dir / "nibble"), "tokenize", "--model", str(TOKENIZER.parent), "--text", text],
                         capture_output=True, text=True, check=True).stdout
    ids = json.loads(out)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    back = subprocess.run([str(build_dir / "nibble"), "detokenize", "--model", str(TOKENIZER.parent), "--ids",
                           ",".join(map(str, ids))], capture_output=True, text=True, check=True).stdout
    assert back == text + "\n"
    bad = subprocess.run([str(build_dir / "nibble"), "detokenize", "--model", str(TOKENIZER.parent), "--ids", "1,x"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "'x' is not a token id" in bad.stderr


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_tokenizer(kind: str, texts: list[str], path):
    """A small byte-level BPE trained with `tokenizers` in another family's configuration:
    'llama3' (Split with Llama-3's regex, ignore_merges, BOS template, merges written as "a b"
    strings) or 'gpt2' (NFKC normalizer, ByteLevel with its own regex and a prefix space)."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    special = ["<|begin_of_text|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    if kind == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.normalizer = normalizers.Sequence([normalizers.NFKC()])
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    if kind == "llama3":
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.save(str(path))
    if kind == "llama3":  # the older "a b" string form of merges
        data = json.loads(path.read_text())
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
        path.write_text(json.dumps(data))
    return Tokenizer.from_file(str(path))


@pytest.mark.parametrize("kind", ["llama3", "gpt2"])
def test_other_tokenizer_families(build_dir, strings, tmp_path, kind):
    path = tmp_path / "tokenizer.json"
    hf = train_tokenizer(kind, strings[:4000], path)
    sample = strings[4000:7000] + ["<|begin_of_text|>hi<|eot_id|>", "x <|eot_id|> y"]
    ours = run_tool(build_dir, "encode", sample, tokenizer=path)
    theirs = [e.ids for e in hf.encode_batch(sample, add_special_tokens=False)]
    bad = [(s, o, t) for s, o, t in zip(sample, ours, theirs) if o != t]
    assert not bad, f"{len(bad)} differ; first: {bad[0]!r}"
    decoded = run_tool(build_dir, "decode", ours, tokenizer=path)
    assert decoded == hf.decode_batch(ours, skip_special_tokens=False)
    with_special = run_tool(build_dir, "encode-add-special", sample[:200], tokenizer=path)
    assert with_special == [e.ids for e in hf.encode_batch(sample[:200], add_special_tokens=True)]
