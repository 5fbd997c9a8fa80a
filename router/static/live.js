// The live page: microphone -> 24 kHz float32 frames -> Kyutai STT websocket -> words.
"use strict";

const SAMPLE_RATE = 24000;
const FRAME_SIZE = 1920;  // one model step (80 ms)
const { encode, decode } = window.MessagePack;

const $ = (id) => document.getElementById(id);
let session = null;

function streamingUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const params = new URLSearchParams();
  const key = $("key").value.trim();
  if (key) params.set("auth_id", key);  // browsers cannot set headers on a websocket
  const pool = $("pool").value.trim() || "default";
  params.set("pool", pool);
  return `${scheme}//${location.host}/api/asr-streaming?${params}`;
}

function setStatus(text) { $("status").textContent = text; }

function addWord(text) {
  const span = document.createElement("span");
  span.className = "word";
  span.textContent = text + " ";
  $("words").appendChild(span);
}

function onMessage(event) {
  const message = decode(new Uint8Array(event.data));
  if (message.type === "Ready") setStatus("listening");
  else if (message.type === "Word") addWord(message.text);
  else if (message.type === "Error") setStatus(`error: ${message.message}`);
}

async function start() {
  $("start").disabled = true;
  $("words").textContent = "";
  // The AudioContext resamples the microphone to the model's 24 kHz.
  const media = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
  const context = new AudioContext({ sampleRate: SAMPLE_RATE });
  const source = context.createMediaStreamSource(media);
  const processor = context.createScriptProcessor(2048, 1, 1);
  const socket = new WebSocket(streamingUrl());
  socket.binaryType = "arraybuffer";
  socket.onmessage = onMessage;
  socket.onclose = () => { setStatus("closed"); stop(); };
  let pending = new Float32Array(0);
  processor.onaudioprocess = (event) => {
    const input = event.inputBuffer.getChannelData(0);
    const joined = new Float32Array(pending.length + input.length);
    joined.set(pending);
    joined.set(input, pending.length);
    let offset = 0;
    for (; offset + FRAME_SIZE <= joined.length; offset += FRAME_SIZE) {
      if (socket.readyState === WebSocket.OPEN) {
        const pcm = Array.from(joined.subarray(offset, offset + FRAME_SIZE));
        socket.send(encode({ type: "Audio", pcm }, { forceFloat32: true }));
      }
    }
    pending = joined.slice(offset);
  };
  source.connect(processor);
  processor.connect(context.destination);
  session = { media, context, socket, processor };
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
