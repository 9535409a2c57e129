// Built-in calibration text for `nibble quantize`: a few paragraphs of prose, code, math,
// dialogue and several scripts, so that max calibration sees the kinds of activations a chat
// model meets. Written for nibble; a real workload's text (--calib FILE) is better.
#pragma once

namespace nibble::tools {

inline constexpr const char* BUILTIN_CALIBRATION_TEXT = R"TEXT(
The harbour was quiet at dawn. Fishing boats rocked against the pier while gulls argued over the
remains of yesterday's catch. Maria checked the weather report twice before deciding that the
wind would hold until noon, then untied the mooring line and pushed off into the grey water.

def merge_sorted(a, b):
    """Merge two sorted lists into one sorted list in O(len(a) + len(b))."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]

Theorem. For every integer n >= 1, the sum 1 + 2 + ... + n equals n(n + 1) / 2.
Proof by induction: the case n = 1 holds since 1 = 1 * 2 / 2. Assume it holds for n; then
1 + ... + n + (n + 1) = n(n + 1)/2 + (n + 1) = (n + 1)(n + 2)/2, which is the claim for n + 1.

User: Can you summarize the main causes of the French Revolution in three bullet points?
Assistant: Certainly. 1) A fiscal crisis after costly wars left the crown nearly bankrupt.
2) A rigid estate system placed the tax burden on the Third Estate. 3) Enlightenment ideas
challenged absolute monarchy and inspired demands for representation.

机器学习模型的量化可以显著减少内存占用，同时保持较高的准确率。今天的天气很好，我们去公园散步吧。
日本語の文章も少し含めておきます。東京は日本の首都です。
Привет! Это короткий текст на русском языке для калибровки модели.
مرحبا بكم في هذا الاختبار القصير للنموذج اللغوي.
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
SELECT name, COUNT(*) AS n FROM orders WHERE created_at > '2024-01-01' GROUP BY name ORDER BY n DESC;
)TEXT";

}  // namespace nibble::tools
