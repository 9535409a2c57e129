// OpenAI chat content parts made ready for a chat template (server/chat_messages.h) and the
// template's content format (ChatTemplate::takes_content_parts), as vLLM's chat_utils decides both.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "server/chat_messages.h"
#include "test_seed.h"
#include "text/chat.h"

namespace {

using json = nlohmann::json;
using nibble::server::chat_messages_for_template;

bool takes_parts(const std::string& source) {
  auto t = nibble::text::ChatTemplate::from_source(source, json::object());
  EXPECT_TRUE(t) << t.status().message();
  return t && (*t)->takes_content_parts();
}

std::string random_text(std::mt19937_64& rng) {
  static const std::string chars = "abcXYZ 019\n\t{}\"'\\<|>é漢";
  std::string s;
  for (int i = int(rng() % 12); i > 0; --i) s += chars[rng() % chars.size()];
  return s;
}

TEST(ChatMessages, TextPartsJoinWithNewlinesForAStringTemplateAndStayPartsForAListTemplate) {
  std::mt19937_64 rng(nibble::test::test_seed("ChatMessages.TextParts"));
  for (int trial = 0; trial < 50; ++trial) {
    json messages = json::array(), parts = json::array();
    std::string joined;
    const int n = 1 + int(rng() % 4);
    for (int i = 0; i < n; ++i) {
      const std::string text = random_text(rng);
      parts.push_back({{"type", "text"}, {"text", text}});
      joined += (i ? "\n" : "") + text;
    }
    messages.push_back({{"role", "system"}, {"content", "be brief"}});
    messages.push_back({{"role", "user"}, {"content", parts}, {"name", "ann"}});
    auto as_string = chat_messages_for_template(messages, false);
    ASSERT_TRUE(as_string) << as_string.status().message();
    EXPECT_EQ((*as_string)[0]["content"], "be brief");
    EXPECT_EQ((*as_string)[1]["content"], joined);
    EXPECT_EQ((*as_string)[1]["name"], "ann");  // other fields pass through
    auto as_parts = chat_messages_for_template(messages, true);
    ASSERT_TRUE(as_parts) << as_parts.status().message();
    EXPECT_EQ((*as_parts)[1]["content"], parts);
  }
}

TEST(ChatMessages, AssistantTurnsMayOmitContentOrRefuse) {
  const json messages = json::parse(R"([
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function",
     "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "content": [{"type": "text", "text": "42"}], "tool_call_id": "1"},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}, {"type": "text", "text": "sorry"}]}])");
  auto out = chat_messages_for_template(messages, false);
  ASSERT_TRUE(out) << out.status().message();
  EXPECT_EQ((*out)[1]["content"], "");  // vLLM's: templates concatenate content
  // Arguments given as JSON text reach the template as an object (vLLM's _postprocess_messages).
  EXPECT_EQ((*out)[1]["tool_calls"][0]["function"]["arguments"], json::object());
  EXPECT_EQ((*out)[1]["tool_calls"][0]["id"], "1");
  EXPECT_EQ((*out)[2]["content"], "42");
  EXPECT_EQ((*out)[3]["content"], "no\nsorry");
}

// The second turn of a tool loop as agents send it (the assistant's call with content null or
// absent, then the tool's result) renders with every template nibble ships and the real Qwen3 one.
TEST(ChatMessages, EveryShippedTemplateRendersAToolLoopsSecondTurn) {
  const std::string data = NIBBLE_SOURCE_DATA_DIR;
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  for (const char* content : {"null", "absent"}) {
    json assistant = {{"role", "assistant"}, {"tool_calls", json::parse(R"([{"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}])")}};
    if (std::string(content) == "null") assistant["content"] = nullptr;
    const json body = {{"messages",
                        {{{"role", "user"}, {"content", "Weather in Paris?"}},
                         assistant,
                         {{"role", "tool"}, {"content", "18 C, sunny"}, {"tool_call_id", "call_1"}}}},
                       {"tools", tools}};
    for (const std::string dir : {data + "/qwen3-tokenizer", data + "/ernie", data + "/default-model"}) {
      auto chat = nibble::text::ChatTemplate::load(dir);
      ASSERT_TRUE(chat) << dir << ": " << chat.status().message();
      auto prompt = nibble::server::render_chat_request(**chat, body, true, true);
      ASSERT_TRUE(prompt) << dir << " (content " << content << "): " << prompt.status().message();
      if (dir != data + "/ernie")  // ERNIE's format has no tool turns (transformers' renders none either)
        EXPECT_NE(prompt->find("18 C, sunny"), std::string::npos) << dir;
    }
  }
}

// transformers' continue_final_message: the prompt ends where the final message's text ends.
TEST(ChatMessages, ContinueFinalMessageCutsAfterTheFinalText) {
  const json messages =
      json::parse(R"([{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}])");
  EXPECT_EQ(*nibble::server::cut_after_final_message("<u>Count</u><a>1, 2,</a>\n", messages), "<u>Count</u><a>1, 2,");
  // Trailing spaces the template trimmed: cut after the stripped text; kept by the template: kept.
  const json spaced = json::parse(R"([{"role": "assistant", "content": "1, 2, "}])");
  EXPECT_EQ(*nibble::server::cut_after_final_message("<a>1, 2,</a>", spaced), "<a>1, 2,");
  EXPECT_EQ(*nibble::server::cut_after_final_message("<a>1, 2, </a>", spaced), "<a>1, 2, ");  // kept, kept
  const json leading = json::parse(R"([{"role": "assistant", "content": " 1"}])");
  EXPECT_EQ(*nibble::server::cut_after_final_message("<a> 1 </a>", leading), "<a> 1");
  const json parts = json::parse(
      R"([{"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "yz"}]}])");
  EXPECT_EQ(*nibble::server::cut_after_final_message("<a>x\nyz</a>", parts), "<a>x\nyz");
  auto missing = nibble::server::cut_after_final_message("<a>dropped</a>", messages);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("does not appear"), std::string::npos);
}

TEST(ChatMessages, BadShapesNameTheMessageAndPart) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("hi")", "must be a list"},
      {R"([1])", "messages[0] must be an object"},
      {R"([{"content": "hi"}])", "messages[0] needs a string 'role'"},
      {R"([{"role": "user"}])", "messages[0]: 'content' is required for role 'user'"},
      {R"([{"role": "system", "content": null}])", "'content' is required for role 'system'"},
      {R"([{"role": "user", "content": 5}])", "'content' must be a string or a list of content parts"},
      {R"([{"role": "user", "content": {"type": "text"}}])", "must be a string or a list"},
      {R"([{"role": "user", "content": "a"}, {"role": "user", "content": ["hi"]}])",
       "messages[1].content[0]: a content part must be an object with a string 'type'"},
      {R"([{"role": "user", "content": [{"text": "hi"}]}])", "string 'type'"},
      {R"([{"role": "user", "content": [{"type": "text"}]}])", "a 'text' part needs a string 'text'"},
      {R"([{"role": "user", "content": [{"type": "text", "text": 3}]}])", "needs a string 'text'"},
      {R"([{"role": "user", "content": [{"type": "text", "text": "a"},
          {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])",
       "messages[0].content[1]: 'image_url' parts are not supported: the served model takes text only"},
      {R"([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])", "'input_audio' parts"},
      {R"([{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}])",
       "unknown content part type 'refusal'"},
      {R"([{"role": "user", "content": [{"type": "hologram"}]}])", "unknown content part type 'hologram'"},
  };
  for (const auto& [messages, needle] : cases) {
    for (bool parts : {false, true}) {
      auto out = chat_messages_for_template(json::parse(messages), parts);
      ASSERT_FALSE(out) << messages;
      EXPECT_NE(out.status().message().find(needle), std::string::npos) << messages << " → " << out.status().message();
    }
  }
}

TEST(ChatMessages, TemplatesThatLoopOverContentTakeParts) {
  EXPECT_TRUE(takes_parts("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}"));
  EXPECT_TRUE(takes_parts("{% for p in messages[0]['content'] %}{{ p['text'] }}{% endfor %}"));
  EXPECT_TRUE(takes_parts("{% if x %}{% for p in message.content | default([], true) %}{% endfor %}{% endif %}"));
  EXPECT_TRUE(
      takes_parts("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
                  "{% for p in m.content[1:] %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}"));
  EXPECT_FALSE(takes_parts("{% for m in messages %}{{ m.role + ': ' + m.content }}{% endfor %}"));
  EXPECT_FALSE(
      takes_parts("{% for m in messages %}{% for line in m.content.split('\\n') %}{{ line }}{% endfor %}"
                  "{% endfor %}"));
  EXPECT_FALSE(takes_parts("{% for m in messages %}{% for t in m.tool_calls %}{{ t }}{% endfor %}{% endfor %}"));
}

TEST(ChatMessages, ShippedTemplatesAreDetected) {
  const std::string data = NIBBLE_SOURCE_DATA_DIR;
  auto qwen = nibble::text::ChatTemplate::load(data + "/qwen3-tokenizer");
  ASSERT_TRUE(qwen) << qwen.status().message();
  EXPECT_FALSE((*qwen)->takes_content_parts());  // Qwen3 takes content as a string
  auto ernie = nibble::text::ChatTemplate::load(data + "/ernie");
  ASSERT_TRUE(ernie) << ernie.status().message();
  EXPECT_FALSE((*ernie)->takes_content_parts());
}

}  // namespace
