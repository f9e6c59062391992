// tpcli serve through the official `openai` npm client, as applications use it.
//
//   node openai_client_test.mjs BASE_URL          (TPCLI_API_KEY: the server's --api-key, if any)
//
// A chat completion, the same one streamed (its deltas must join to the whole answer at
// temperature 0, with a usage chunk when stream_options.include_usage asks for one), a text
// completion whole and streamed, and a 400 raised as the client's BadRequestError. Exit 1 on any
// mismatch.
import OpenAI from "openai";

const [baseArg] = process.argv.slice(2);
if (!baseArg) {
  console.error("usage: node openai_client_test.mjs BASE_URL");
  process.exit(2);
}
const client = new OpenAI({ baseURL: baseArg.replace(/\/+$/, "") + "/v1",
                            apiKey: process.env.TPCLI_API_KEY || "no-key", maxRetries: 0, timeout: 120_000 });
const MAX_TOKENS = 24;

function check(ok, message) {
  if (!ok) {
    console.error("openai_client_test: FAIL: " + message);
    process.exit(1);
  }
  console.log("openai_client_test: ok: " + message);
}

async function main() {
  const models = await client.models.list();
  const model = models.data[0]?.id;
  check(typeof model === "string" && model.length > 0, `models.list() names the model "${model}"`);

  const messages = [{ role: "system", content: "You are a storyteller." },
                    { role: "user", content: "Tell me a story about a dog." }];
  const whole = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: MAX_TOKENS });
  const content = whole.choices[0]?.message?.content;
  check(whole.object === "chat.completion" && whole.choices[0].message.role === "assistant" &&
        typeof content === "string" && content.length > 0,
        `chat.completions.create: ${JSON.stringify(content)} (${whole.choices[0].finish_reason})`);
  check(whole.usage && whole.usage.completion_tokens > 0 && whole.usage.completion_tokens <= MAX_TOKENS &&
        whole.usage.total_tokens === whole.usage.prompt_tokens + whole.usage.completion_tokens,
        `usage ${JSON.stringify(whole.usage)}`);

  const stream = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: MAX_TOKENS,
                                                        stream: true, stream_options: { include_usage: true } });
  const deltas = [];
  let role = null, finish = null, usage = null, chunks = 0, otherObjects = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.object !== "chat.completion.chunk") otherObjects++;
    if (chunk.usage) {
      usage = chunk.usage;
      check(chunk.choices.length === 0, "the usage chunk has no choices");
      continue;
    }
    const choice = chunk.choices[0];
    if (choice.delta.role) role = choice.delta.role;
    if (choice.delta.content) deltas.push(choice.delta.content);
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  check(otherObjects === 0, `all ${chunks} chunks are chat.completion.chunk objects`);
  check(role === "assistant", "the stream's first delta names the assistant");
  check(deltas.join("") === content,
        `${deltas.length} streamed deltas join to the non-streamed answer (${JSON.stringify(deltas.join(""))})`);
  check(finish === whole.choices[0].finish_reason, `streamed finish_reason "${finish}" matches`);
  check(usage !== null && usage.completion_tokens === whole.usage.completion_tokens &&
        usage.prompt_tokens === whole.usage.prompt_tokens,
        `include_usage: the usage chunk ${JSON.stringify(usage)} matches the whole answer's`);

  const prompt = "Once upon a time";
  const completion = await client.completions.create({ model, prompt, temperature: 0, max_tokens: MAX_TOKENS });
  const text = completion.choices[0]?.text;
  check(completion.object === "text_completion" && typeof text === "string" && text.length > 0,
        `completions.create: ${JSON.stringify(text)}`);
  const parts = [];
  for await (const chunk of await client.completions.create({ model, prompt, temperature: 0, max_tokens: MAX_TOKENS,
                                                              stream: true })) {
    if (chunk.choices[0]?.text) parts.push(chunk.choices[0].text);
  }
  check(parts.join("") === text, `${parts.length} streamed completion pieces join to the whole text`);

  try {
    await client.chat.completions.create({ model, messages, max_tokens: 100000000 });
    check(false, "max_tokens far beyond the context is refused");
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400 && typeof e.error?.message === "string",
          `max_tokens far beyond the context: BadRequestError ${e.status}: ${e.error?.message ?? e}`);
  }
}

main().catch((e) => {
  console.error("openai_client_test: FAIL: " + (e && e.stack || e));
  process.exit(1);
});
