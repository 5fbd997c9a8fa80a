// The live page: microphone -> 24 kHz float32 frames -> Kyutai STT websocket -> words.
"use strict";

const SAMPLE_RATE = 24000;
const FRAME_SIZE = 1920;  // one model step (80 ms)
const { encode, decode } = window.MessagePack;

const $ = (id) => document.getElementById(id);
let session = null;

// A dropped connection (a network cut, a router rolling) is resumed: the router names
// the stream's token and the audio its pod holds in a "Resumable" message after the
// Ready (a browser can neither send a websocket's headers nor read its 101's), and the
// page sends again what the pod did not get, from the audio it keeps.
const RESUMABLE_CLOSES = new Set([1001, 1005, 1006, 1012]);
const MAX_TRIES = 5;
const KEPT_FRAMES = 30 * SAMPLE_RATE / FRAME_SIZE;  // 30 s of audio kept for a resume

function streamingUrl(stream) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const params = new URLSearchParams();
  const key = $("key").value.trim();
  if (key) params.set("auth_id", key);  // browsers cannot set headers on a websocket
  if (stream.token) {
    params.set("asrpool-resume-token", stream.token);
    params.set("asrpool-resume-received", String(stream.received));
  } else {
    params.set("pool", $("pool").value.trim() || "default");
    params.set("asrpool-resumable", "1");
  }
  return `${scheme}//${location.host}/api/asr-streaming?${params}`;
}

function setStatus(text) { $("status").textContent = text; }

function addWord(text) {
  const span = document.createElement("span");
  span.className = "word";
  span.textContent = text + " ";
  $("words").appendChild(span);
}

function onMessage(stream, event) {
  const message = decode(new Uint8Array(event.data));
  if (message.type === "Ready") setStatus("listening");
  else if (message.type === "Resumable") resumed(stream, message);
  else if (message.type === "Error" && message.code === "draining") {
    setStatus("reconnecting");  // the router's: its close follows, resume elsewhere
  } else {
    stream.received += 1;  // the count a resume names (the pod's messages)
    if (message.type === "Word") addWord(message.text);
    else if (message.type === "Error") setStatus(`error: ${message.message}`);
  }
}

function resumed(stream, message) {
  stream.token = message.token;
  stream.tries = 0;
  sendFrom(stream, message.offset);  // 0 on a new stream: what was heard while it opened
  stream.live = true;
}

function sendFrom(stream, offset) {
  for (const frame of stream.kept) {
    const end = frame.start + frame.pcm.length;
    if (end > offset) send(stream, frame.pcm.subarray(Math.max(offset - frame.start, 0)));
  }
}

function send(stream, pcm) {
  if (stream.socket.readyState !== WebSocket.OPEN) return;
  stream.socket.send(encode({ type: "Audio", pcm: Array.from(pcm) }, { forceFloat32: true }));
}

function takeFrame(stream, pcm) {
  stream.kept.push({ start: stream.samples, pcm });
  stream.samples += pcm.length;
  if (stream.kept.length > KEPT_FRAMES) stream.kept.shift();
  if (stream.live) send(stream, pcm);
}

function connect(stream) {
  const socket = new WebSocket(streamingUrl(stream));
  socket.binaryType = "arraybuffer";
  socket.onmessage = (event) => onMessage(stream, event);
  socket.onclose = (event) => onClose(stream, event);
  stream.socket = socket;
  stream.live = false;
}

function onClose(stream, event) {
  if (session !== stream) return;  // stopped by the user
  if (stream.token && RESUMABLE_CLOSES.has(event.code) && stream.tries < MAX_TRIES) {
    stream.tries += 1;
    stream.live = false;
    setStatus("reconnecting");
    setTimeout(() => { if (session === stream) connect(stream); }, 200 * stream.tries);
    return;
  }
  setStatus("closed");
  stop();
}

async function start() {
  $("start").disabled = true;
  $("words").textContent = "";
  // The AudioContext resamples the microphone to the model's 24 kHz.
  const media = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
  const context = new AudioContext({ sampleRate: SAMPLE_RATE });
  const source = context.createMediaStreamSource(media);
  const processor = context.createScriptProcessor(2048, 1, 1);
  const stream = { media, context, processor, socket: null, live: false, token: null,
                   received: 0, samples: 0, kept: [], tries: 0 };
  let pending = new Float32Array(0);
  processor.onaudioprocess = (event) => {
    const input = event.inputBuffer.getChannelData(0);
    const joined = new Float32Array(pending.length + input.length);
    joined.set(pending);
    joined.set(input, pending.length);
    let offset = 0;
    for (; offset + FRAME_SIZE <= joined.length; offset += FRAME_SIZE) {
      takeFrame(stream, joined.slice(offset, offset + FRAME_SIZE));
    }
    pending = joined.slice(offset);
  };
  source.connect(processor);
  processor.connect(context.destination);
  session = stream;
  connect(stream);
  setStatus("connecting");
  $("stop").disabled = false;
}

function stop() {
  if (!session) return;
  const { media, context, socket, processor } = session;
  session = null;
  processor.disconnect();
  media.getTracks().forEach((track) => track.stop());
  context.close();
  if (socket.readyState === WebSocket.OPEN) socket.close();
  $("start").disabled = false;
  $("stop").disabled = true;
}

async function refreshPools() {
  try {
    const key = $("key").value.trim();  // with API keys on, the view needs one too
    const response = await fetch("api/pools", key ? { headers: { "kyutai-api-key": key } } : {});
    if (response.status === 401) { setStatus("enter an API key to see the pools"); return; }
    const { pools } = await response.json();
    const body = document.querySelector("#pools tbody");
    body.replaceChildren(...Object.entries(pools).map(([name, pool]) => {
      const row = document.createElement("tr");
      for (const cell of [name, pool.pods.length, pool.total_slots, pool.free_slots, pool.waiting]) {
        const td = document.createElement("td");
        td.textContent = String(cell);  // pool names come from pods: never parse them as HTML
        row.appendChild(td);
      }
      return row;
    }));
  } catch (error) {
    setStatus(`cannot read pools: ${error}`);
  }
}

$("start").onclick = () => start().catch((error) => { setStatus(`error: ${error}`); stop(); });
$("stop").onclick = stop;
refreshPools();
setInterval(refreshPools, 1000);
