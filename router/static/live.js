// The live page: the microphone to this router's streaming route, words as they come,
// and the pools' slots; the stream and the microphone are asrpool.js's.
"use strict";

const $ = (id) => document.getElementById(id);
let session = null;  // { stream, mic } while listening

function setStatus(text) { $("status").textContent = text; }

function addWord(word) {
  const span = document.createElement("span");
  span.className = "word";
  span.textContent = word.text + " ";
  $("words").appendChild(span);
}

async function start() {
  $("start").disabled = true;
  $("words").textContent = "";
  const stream = asrpool.openStream({
    pool: $("pool").value.trim() || "default", key: $("key").value.trim(),
    onWord: addWord, onStatus: setStatus, onClosed: stop,
  });
  const current = { stream, mic: null };
  session = current;
  try {
    current.mic = await asrpool.recordMicrophone((frame) => stream.pushAudio(frame));
  } catch (error) {
    stop();
    throw error;
  }
  if (session !== current) current.mic.stop();  // closed while the microphone opened
  $("stop").disabled = false;
}

function stop() {
  if (!session) return;
  const { stream, mic } = session;
  session = null;
  if (mic) mic.stop();
  stream.close();
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
