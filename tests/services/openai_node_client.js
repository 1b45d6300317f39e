// The official `openai` npm package against strata-server's HTTP API (run by http_api_test.sh, which puts
// the package on NODE_PATH). Completions whole and streamed (greedy, so both give the same text), an error
// with OpenAI's fields, the model list; chat whole and streamed with --chat (once the server renders chat
// templates), else the chat endpoint's "template not available" error. Exits 1 on the first mismatch.
//
//   node openai_node_client.js --base-url http://127.0.0.1:PORT/v1 --model NAME [--chat]
'use strict';
const OpenAI = require('openai');

function arg(name) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}
function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function main() {
  const baseURL = arg('--base-url');
  const model = arg('--model');
  const chat = process.argv.includes('--chat');
  check(baseURL && model, 'usage: openai_node_client.js --base-url URL --model NAME [--chat]');
  const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  // Greedy and past end-of-text (a vLLM/llama-server extension the package passes through as it is).
  const greedy = { model, max_tokens: 8, temperature: 0, ignore_eos: true };

  const models = await client.models.list();
  check(models.data.some((m) => m.id === model), `models.list() lacks ${model}: ${JSON.stringify(models.data)}`);

  const whole = await client.completions.create({ ...greedy, prompt: 'Once upon a time' });
  check(whole.object === 'text_completion', `object ${whole.object}`);
  check(typeof whole.choices[0].text === 'string' && whole.choices[0].text.length > 0, 'empty completion');
  check(whole.choices[0].finish_reason === 'length', `finish_reason ${whole.choices[0].finish_reason}`);
  check(whole.usage.completion_tokens === 8, `usage ${JSON.stringify(whole.usage)}`);
  console.log(`completion: ${JSON.stringify(whole.choices[0].text)}`);

  const stream = await client.completions.create({
    ...greedy, prompt: 'Once upon a time', stream: true, stream_options: { include_usage: true },
  });
  let streamed = '';
  let chunks = 0;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length > 0) {
      streamed += chunk.choices[0].text;
      chunks += 1;
    }
  }
  check(chunks >= 2, `${chunks} chunks streamed`);
  check(streamed === whole.choices[0].text, `streamed ${JSON.stringify(streamed)} != whole ${JSON.stringify(whole.choices[0].text)}`);
  check(usage && usage.completion_tokens === 8, `stream usage ${JSON.stringify(usage)}`);
  console.log(`streamed ${chunks} chunks`);

  try {
    await client.completions.create({ ...greedy, prompt: 'x', max_tokens: 0 });
    check(false, 'max_tokens 0 was accepted');
  } catch (error) {
    check(error instanceof OpenAI.APIError, `not an APIError: ${error}`);
    check(error.status === 400, `status ${error.status}`);
    check(error.param === 'max_tokens', `param ${error.param}`);
    console.log(`error: ${error.status} ${error.message}`);
  }

  const messages = [{ role: 'user', content: 'Say hello.' }];
  if (chat) {
    const reply = await client.chat.completions.create({ ...greedy, messages });
    check(reply.object === 'chat.completion', `object ${reply.object}`);
    check(reply.choices[0].message.role === 'assistant', 'no assistant message');
    const chatStream = await client.chat.completions.create({ ...greedy, messages, stream: true });
    let content = '';
    for await (const chunk of chatStream) {
      check(chunk.object === 'chat.completion.chunk', `object ${chunk.object}`);
      content += chunk.choices[0]?.delta?.content ?? '';
    }
    check(content === reply.choices[0].message.content, 'streamed chat differs from the whole reply');
    console.log(`chat: ${JSON.stringify(content)}`);
  } else {
    try {
      await client.chat.completions.create({ ...greedy, messages });
      check(false, 'chat answered without a chat template');
    } catch (error) {
      check(error instanceof OpenAI.APIError, `not an APIError: ${error}`);
      check(error.code === 'chat_template_unavailable', `code ${error.code} (${error.message})`);
      console.log(`chat: ${error.status} ${error.message}`);
    }
  }
  console.log('openai_node_client: ok');
}

main().catch((error) => {
  console.error(`openai_node_client: ${error.stack || error}`);
  process.exit(1);
});
