// OpenAI's official Node SDK (openai, pinned in package.json), unchanged, for one
// transcription session: it connects to BASE_URL with API_KEY, sets manual turns,
// appends AUDIO_FILE (16-bit PCM at 24 kHz) in one event, commits, and prints every
// event it received, one JSON per line, once the turn is completed. The SDK always
// dials wss: the test puts TLS in front of the router and names its CA in CA_FILE.
import fs from 'node:fs';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';

const { BASE_URL, API_KEY, AUDIO_FILE, CA_FILE } = process.env;
const client = new OpenAI({ apiKey: API_KEY, baseURL: BASE_URL });
const rt = new OpenAIRealtimeWS(
  { intent: 'transcription', options: { ca: fs.readFileSync(CA_FILE) } }, client);
const received = [];
const done = (code) => {
  for (const event of received) console.log(JSON.stringify(event));
  process.exit(code);
};
setTimeout(() => { console.error('no completed turn within 60 s'); done(1); }, 60_000);

rt.on('event', (event) => received.push(event));
rt.on('error', (error) => { console.error('error:', error.message); done(1); });
rt.on('session.created', () => {
  rt.send({ type: 'session.update', session: {
    type: 'transcription', audio: { input: { turn_detection: null } } } });
});
rt.on('session.updated', () => {
  rt.send({ type: 'input_audio_buffer.append',
            audio: fs.readFileSync(AUDIO_FILE).toString('base64') });
  rt.send({ type: 'input_audio_buffer.commit' });
});
rt.on('conversation.item.input_audio_transcription.completed', () => done(0));
