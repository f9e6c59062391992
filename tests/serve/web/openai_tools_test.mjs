// Tool calls and structured outputs through the official `openai` npm client, as agents use them,
// against `tpcli serve` on a random-weight Qwen3-shaped model with Qwen3's tokenizer and template.
//
//   node openai_tools_test.mjs BASE_URL
//
// Random weights write no call of their own: the calls checked here are the ones `tool_choice`
// ("required", a named function) makes the model write, and the JSON answer is the one
// `response_format` makes it write. Each call must name a declared function and its arguments
// must validate against that function's parameters (a validator below, apart from the server's
// grammar code); the streamed deltas must join to the same calls; the call and its result go back
// as history for a second turn. Exit 1 on any mismatch.
import OpenAI from "openai";

const [baseArg] = process.argv.slice(2);
if (!baseArg) {
  console.error("usage: node openai_tools_test.mjs BASE_URL");
  process.exit(2);
}
const client = new OpenAI({ baseURL: baseArg.replace(/\/+$/, "") + "/v1", apiKey: "no-key", maxRetries: 0, timeout: 300_000 });
const MAX_TOKENS = 200;

function check(ok, message) {
  if (!ok) {
    console.error("openai_tools_test: FAIL: " + message);
    process.exit(1);
  }
  console.log("openai_tools_test: ok: " + message);
}

// The JSON Schema keywords the tools below use, checked by hand: "" when `value` holds, else why not.
function violation(schema, value, at = "$") {
  const type = Array.isArray(value) ? "array" : value === null ? "null" : typeof value;
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) return `${at}: not one of the enum`;
  if (schema.type) {
    const types = [].concat(schema.type);
    const ok = types.some((t) => t === type || (t === "integer" && type === "number" && Number.isInteger(value)));
    if (!ok) return `${at}: ${type}, not ${types.join("|")}`;
  }
  if (type === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) return `${at}: below ${schema.minimum}`;
    if (schema.maximum !== undefined && value > schema.maximum) return `${at}: above ${schema.maximum}`;
  }
  if (type === "string") {
    const length = [...value].length;
    if (schema.minLength !== undefined && length < schema.minLength) return `${at}: shorter than ${schema.minLength}`;
    if (schema.maxLength !== undefined && length > schema.maxLength) return `${at}: longer than ${schema.maxLength}`;
  }
  if (type === "array") {
    if (schema.minItems !== undefined && value.length < schema.minItems) return `${at}: fewer than ${schema.minItems} items`;
    if (schema.maxItems !== undefined && value.length > schema.maxItems) return `${at}: more than ${schema.maxItems} items`;
    for (let i = 0; i < value.length && schema.items; i++) {
      const why = violation(schema.items, value[i], `${at}[${i}]`);
      if (why) return why;
    }
  }
  if (type === "object") {
    for (const key of schema.required || []) if (!(key in value)) return `${at}: '${key}' is required`;
    for (const [key, v] of Object.entries(value)) {
      const property = schema.properties?.[key];
      if (!property) {
        if (schema.additionalProperties === false) return `${at}: '${key}' is not a declared property`;
        continue;
      }
      const why = violation(property, v, `${at}.${key}`);
      if (why) return why;
    }
  }
  return "";
}

const tools = [
  { type: "function", function: { name: "get_weather", description: "The current weather in a city",
    parameters: { type: "object", additionalProperties: false, required: ["city", "unit"],
                  properties: { city: { type: "string", minLength: 1, maxLength: 24 },
                                unit: { type: "string", enum: ["celsius", "fahrenheit"] } } } } },
  { type: "function", function: { name: "add_numbers", description: "Add a list of numbers",
    parameters: { type: "object", additionalProperties: false, required: ["numbers"],
                  properties: { numbers: { type: "array", items: { type: "integer", minimum: -1000, maximum: 1000 },
                                           minItems: 1, maxItems: 4 } } } } },
];

function checkCalls(calls, label, onlyName = null) {
  check(Array.isArray(calls) && calls.length >= 1, `${label}: ${calls?.length ?? 0} tool call(s)`);
  for (const call of calls) {
    const tool = tools.find((t) => t.function.name === call.function?.name);
    check(call.type === "function" && typeof call.id === "string" && call.id.length > 0 && tool !== undefined,
          `${label}: call ${call.id} names the declared function "${call.function?.name}"`);
    if (onlyName) check(call.function.name === onlyName, `${label}: the named function ${onlyName} is the one called`);
    let args;
    try {
      args = JSON.parse(call.function.arguments);
    } catch (e) {
      check(false, `${label}: arguments ${JSON.stringify(call.function.arguments)} parse as JSON (${e})`);
    }
    const why = violation(tool.function.parameters, args);
    check(why === "", `${label}: arguments ${call.function.arguments} validate against ${tool.function.name}'s parameters${why ? " (" + why + ")" : ""}`);
  }
}

async function main() {
  const model = (await client.models.list()).data[0].id;
  const messages = [{ role: "user", content: "What is the weather in Paris, in celsius?" }];

  const auto = await client.chat.completions.create({ model, messages, tools, temperature: 0, max_tokens: 16 });
  check(auto.choices[0].message.role === "assistant" && ["stop", "length", "tool_calls"].includes(auto.choices[0].finish_reason),
        `tools with tool_choice "auto" answers (${auto.choices[0].finish_reason})`);

  // Parallel calls allowed, random weights rarely choose to stop between calls: the answer may run
  // to max_tokens, every call it finished is whole.
  const parallel = await client.chat.completions.create({ model, messages, tools, tool_choice: "required",
                                                          temperature: 0.8, seed: 7, max_tokens: MAX_TOKENS });
  check(["tool_calls", "length"].includes(parallel.choices[0].finish_reason),
        `tool_choice "required": finish_reason "${parallel.choices[0].finish_reason}"`);
  checkCalls(parallel.choices[0].message.tool_calls, 'tool_choice "required"');

  const oneCall = { model, messages, tools, tool_choice: "required", parallel_tool_calls: false, temperature: 0.8, seed: 7,
                    max_tokens: MAX_TOKENS };
  const required = await client.chat.completions.create(oneCall);
  const choice = required.choices[0];
  check(choice.finish_reason === "tool_calls" && choice.message.content === null,
        `tool_choice "required", parallel_tool_calls false: finish_reason "${choice.finish_reason}", content ${choice.message.content}`);
  checkCalls(choice.message.tool_calls, 'tool_choice "required", parallel_tool_calls false');
  check(choice.message.tool_calls.length === 1, "parallel_tool_calls false: one call");

  const named = await client.chat.completions.create({ model, messages, tools, temperature: 0.8, seed: 11, max_tokens: MAX_TOKENS,
                                                       tool_choice: { type: "function", function: { name: "add_numbers" } } });
  check(["tool_calls", "length"].includes(named.choices[0].finish_reason), `a named function: finish_reason "${named.choices[0].finish_reason}"`);
  checkCalls(named.choices[0].message.tool_calls, "a named function", "add_numbers");

  // The same request streamed: the deltas' pieces join to the calls of the whole answer.
  const stream = await client.chat.completions.create({ ...oneCall, stream: true });
  const streamed = [];
  let finish = null;
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta;
    for (const piece of delta?.tool_calls ?? []) {
      const call = (streamed[piece.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
      if (piece.id) call.id = piece.id;
      if (piece.function?.name) call.function.name += piece.function.name;
      if (piece.function?.arguments) call.function.arguments += piece.function.arguments;
    }
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  check(finish === "tool_calls", `streamed: finish_reason "${finish}"`);
  const calls = (list) => JSON.stringify(list.map((c) => [c.id, c.function.name, c.function.arguments]));
  check(calls(streamed) === calls(choice.message.tool_calls),
        `streamed: ${streamed.length} delta.tool_calls join to the whole answer's calls (${calls(streamed)} vs ${calls(choice.message.tool_calls)})`);

  // The round trip: the call and its result go back as history, rendered by the model's template.
  const history = [...messages, choice.message,
                   ...choice.message.tool_calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: '{"temperature": 21}' }))];
  const answer = await client.chat.completions.create({ model, messages: history, tools, temperature: 0, max_tokens: 16 });
  check(typeof answer.choices[0].message.content === "string" && answer.usage.prompt_tokens > required.usage.prompt_tokens,
        `the call and its result as history: answered from ${answer.usage.prompt_tokens} prompt tokens`);

  // Structured output: a JSON schema's answer parses and validates.
  const schema = { type: "object", additionalProperties: false, required: ["city", "days"],
                   properties: { city: { type: "string", maxLength: 20 },
                                 days: { type: "array", items: { type: "integer", minimum: 0, maximum: 31 }, minItems: 1, maxItems: 3 } } };
  const structured = await client.chat.completions.create({ model, temperature: 0.8, seed: 3, max_tokens: MAX_TOKENS,
    messages: [{ role: "user", content: "Which days will it rain in Paris?" }],
    response_format: { type: "json_schema", json_schema: { name: "rain", strict: true, schema } } });
  const text = structured.choices[0].message.content;
  check(structured.choices[0].finish_reason === "stop", `response_format json_schema: finish_reason "${structured.choices[0].finish_reason}"`);
  const why = violation(schema, JSON.parse(text));
  check(why === "", `response_format json_schema: ${text} validates${why ? " (" + why + ")" : ""}`);

  try {
    await client.chat.completions.create({ model, messages, tools, tool_choice: { type: "function", function: { name: "nope" } } });
    check(false, "a tool_choice naming an undeclared function is refused");
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, `a tool_choice naming an undeclared function: ${e.status}: ${e.error?.message ?? e}`);
  }
}

main().catch((e) => {
  console.error("openai_tools_test: FAIL: " + (e && e.stack || e));
  process.exit(1);
});
