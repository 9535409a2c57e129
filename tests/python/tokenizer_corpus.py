"""A seeded corpus of strings that exercise byte-level BPE tokenizers: many scripts, emoji
sequences, combining marks, code, whitespace and digit runs, contractions, special tokens inside
text, NUL and other control characters, and random Unicode."""
import random
import unicodedata

SAMPLES = {
    "cjk": ["你好，世界！今天天气很好。", "日本語のテキストです。カタカナとひらがな", "한국어 문장입니다. 안녕하세요",
            "机器学习模型的量化", "東京都渋谷区", "中文English混合text测试123"],
    "arabic": ["مرحبا بالعالم", "اللغة العربية جميلة جداً", "٠١٢٣٤٥٦٧٨٩ أرقام"],
    "devanagari": ["नमस्ते दुनिया", "हिन्दी भाषा में पाठ", "क्षत्रिय ज्ञान"],
    "thai": ["สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่างระหว่างคำ"],
    "cyrillic": ["Привет, мир!", "Съешь же ещё этих мягких французских булок", "Ёлка и ёжик"],
    "greek": ["Γειά σου Κόσμε", "ΑΒΓΔ αβγδ"],
    "emoji": ["👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏿‍💻 coding", "❤️🔥", "🇯🇵🇺🇸", "😀😃😄😁"],
    "combining": ["e\u0301", "a\u0308o\u0308u\u0308", "n\u0303", "Å", "A\u030a", "ﬁ ligature", "\u1e9b\u0323"],
    "code": ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
             "SELECT * FROM t WHERE id = 42;", "<div class=\"a\">hi</div>", "x = {'a': [1, 2, 3]}",
             "#include <stdio.h>\nint main(){}", "   \t  indented\tline", "a_b-c.d/e\\f"],
    "whitespace": ["   ", "\n\n\n", "\t\t", " \n \n ", "a  b   c    d", "line1\r\nline2\r\n", "\u00a0nbsp\u3000ideo",
                   "trailing   ", "\n", " ", "x\n\n\ny"],
    "digits": ["1234567890", "3.14159265358979", "1,000,000", "2026-11-30", "0x1F3A", "v1.2.3", "９８７"],
    "contractions": ["don't", "I'm", "we've", "they'll", "she'd", "it's", "DON'T", "You're", "O'Neil"],
    "special": ["<|im_start|>user\nhi<|im_end|>", "text<|endoftext|>more", "<think>\nreasoning\n</think>\n\nanswer",
                "<|im_start|><|im_start|>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "a<|im_end|>b"],
    # NUL and other controls must never cut or drop text (a NUL-terminated normalizer once did).
    "control": ["a\u0000b c d", "\u0000", "\u0000\u0000x", "end\u0000", "x\u0001\u0002\u0003y", "\u001b[31mred\u001b[0m",
                "del\u007f", "c1\u0085\u0090\u009f", "tab\u000bvt\u000cff", "e\u0000\u0301", "你\u0000好"],
}


def same_in_all_unicode_versions(cp: int) -> bool:
    """tokenizers (Rust: unicode-normalization, Oniguruma) and nibble (utf8proc, PCRE2) were built
    with different Unicode versions, so a character assigned in a recent version is a letter to one
    and unassigned to the other, or has a combining class only one knows. Random text keeps to
    characters assigned by Unicode 3.2 whose category has not changed since, and emoji (no
    normalization, symbol class everywhere). U+180E is left out: PCRE2 keeps it in its fixed list
    of white space (backslash-s), Oniguruma does not (a known difference, docs/text.md)."""
    if cp == 0x180E:
        return False
    if 0x1F300 <= cp <= 0x1FAFF:
        return unicodedata.category(chr(cp)) == "So"
    old = unicodedata.ucd_3_2_0.category(chr(cp))
    return old != "Cn" and old == unicodedata.category(chr(cp))


def random_unicode(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(1, 24)):
        block = rng.random()
        if block < 0.3:
            cp = rng.randint(0x20, 0x7E)
        elif block < 0.5:
            cp = rng.randint(0xA0, 0x2FFF)
        elif block < 0.7:
            cp = rng.randint(0x3000, 0x9FFF)
        elif block < 0.8:
            cp = rng.randint(0x1F300, 0x1FAFF)
        elif block < 0.85:
            cp = rng.choice([0x0A, 0x09, 0x0D, 0x20, 0x200D, 0xFE0F, 0x0301])
        elif block < 0.9:  # C0 and C1 controls, NUL included
            cp = rng.choice([rng.randint(0x00, 0x1F), rng.randint(0x7F, 0x9F)])
        else:
            cp = rng.randint(0xA000, 0x10FFFF)
        if 0xD800 <= cp <= 0xDFFF or not same_in_all_unicode_versions(cp):
            cp = 0xFFFD  # no lone surrogates: a Python str with one cannot be UTF-8 encoded
        out.append(chr(cp))
    return "".join(out)


def corpus(seed: int, n: int = 10000) -> list[str]:
    rng = random.Random(seed)
    fixed = [s for group in SAMPLES.values() for s in group]
    items = list(fixed)
    while len(items) < n:
        kind = rng.random()
        if kind < 0.5:  # concatenations of samples with random separators
            parts = rng.sample(fixed, rng.randint(2, 5))
            items.append(rng.choice(["", " ", "\n", "  ", "\t", "\n\n"]).join(parts))
        elif kind < 0.8:
            items.append(random_unicode(rng))
        else:  # runs of repeated characters and digits
            ch = rng.choice(["a", " ", "\n", "1", "你", "😀", "-", "=", "0"])
            items.append(ch * rng.randint(1, 40) + rng.choice(["", "x", " end", "9"]))
    return items
