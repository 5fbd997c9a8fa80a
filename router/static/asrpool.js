// asrpool's browser module: a stream to a router (Kyutai's protocol, msgpack) that
// resumes by itself, and the microphone as 24 kHz frames. The live page is built on it;
// a page of your own loads msgpack and this file, then:
//
//   const stream = asrpool.openStream({ url: "wss://asr.example.com", pool: "default",
//                                       key: KEY, onWord: (word) => show(word.text) });
//   const mic = await asrpool.recordMicrophone((frame) => stream.pushAudio(frame));
//   ...  mic.stop(); stream.close();
//
// A dropped connection (a network cut, a router rolling) is resumed: the router names
// the stream's token and the audio its pod holds in a "Resumable" message after the
// Ready (a browser can neither send a websocket's headers nor read its 101's), and the
// stream sends again what the pod did not get, from the audio it keeps.
"use strict";

(function (global) {
  const SAMPLE_RATE = 24000;
  const FRAME_SIZE = 1920;  // one model step (80 ms)
  const RESUMABLE_CLOSES = new Set([1001, 1005, 1006, 1012]);
  const MAX_TRIES = 5;
  const KEPT_FRAMES = 30 * SAMPLE_RATE / FRAME_SIZE;  // 30 s of audio kept for a resume

  function streamingUrl(stream) {
    const params = new URLSearchParams();
    if (stream.key) params.set("auth_id", stream.key);  // no headers on a browser's websocket
    if (stream.token) {
      params.set("asrpool-resume-token", stream.token);
      params.set("asrpool-resume-received", String(stream.received));
    } else {
      params.set("pool", stream.pool);
      params.set("asrpool-resumable", "1");
    }
    return `${stream.url}/api/asr-streaming?${params}`;
  }

  function onMessage(stream, event) {
    const message = global.MessagePack.decode(new Uint8Array(event.data));
    if (message.type === "Ready") stream.onStatus("listening");
    else if (message.type === "Resumable") resumed(stream, message);
    else if (message.type === "Error" && message.code === "draining") {
      stream.onStatus("reconnecting");  // the router's: its close follows, resume elsewhere
    } else {
      stream.received += 1;  // the count a resume names (the pod's messages)
      if (message.type === "Word") stream.onWord({ text: message.text, start: message.start_time });
      else if (message.type === "Error") stream.onStatus(`error: ${message.message}`);
      stream.onMessage(message);
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
    const message = { type: "Audio", pcm: Array.from(pcm) };
    stream.socket.send(global.MessagePack.encode(message, { forceFloat32: true }));
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
    if (stream.closed) return;  // closed by the page
    if (stream.token && RESUMABLE_CLOSES.has(event.code) && stream.tries < MAX_TRIES) {
      stream.tries += 1;
      stream.live = false;
      stream.onStatus("reconnecting");
      setTimeout(() => { if (!stream.closed) connect(stream); }, 200 * stream.tries);
      return;
    }
    stream.closed = true;
    stream.onStatus("closed");
    stream.onClosed(event);
  }

  // A stream to the routers at `url` (ws[s]://HOST, default: this page's host). Push
  // 24 kHz float samples with pushAudio (any length: they are kept for a resume and sent
  // as they come); words come to onWord({text, start}), every other message of the pod's
  // to onMessage, the stream's state to onStatus, its end to onClosed.
  function openStream(options) {
    const scheme = global.location.protocol === "https:" ? "wss:" : "ws:";
    const stream = {
      url: options.url || `${scheme}//${global.location.host}`,
      pool: options.pool || "default", key: options.key || "",
      onWord: options.onWord || (() => {}), onMessage: options.onMessage || (() => {}),
      onStatus: options.onStatus || (() => {}), onClosed: options.onClosed || (() => {}),
      socket: null, live: false, token: null, received: 0, samples: 0, kept: [], tries: 0,
      closed: false,
    };
    connect(stream);
    stream.onStatus("connecting");
    return {
      pushAudio(pcm) {
        stream.kept.push({ start: stream.samples, pcm });
        stream.samples += pcm.length;
        if (stream.kept.length > KEPT_FRAMES) stream.kept.shift();
        if (stream.live) send(stream, pcm);
      },
      close() {
        stream.closed = true;
        if (stream.socket.readyState === WebSocket.OPEN) stream.socket.close();
      },
    };
  }

  // The microphone as 80 ms frames of 24 kHz float samples (the AudioContext resamples
  // it), each handed to onFrame; stop() releases it.
  async function recordMicrophone(onFrame) {
    const media = await global.navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    const context = new AudioContext({ sampleRate: SAMPLE_RATE });
    const source = context.createMediaStreamSource(media);
    const processor = context.createScriptProcessor(2048, 1, 1);
    let pending = new Float32Array(0);
    processor.onaudioprocess = (event) => {
      const input = event.inputBuffer.getChannelData(0);
      const joined = new Float32Array(pending.length + input.length);
      joined.set(pending);
      joined.set(input, pending.length);
      let offset = 0;
      for (; offset + FRAME_SIZE <= joined.length; offset += FRAME_SIZE) {
        onFrame(joined.slice(offset, offset + FRAME_SIZE));
      }
      pending = joined.slice(offset);
    };
    source.connect(processor);
    processor.connect(context.destination);
    return {
      stop() {
        processor.disconnect();
        media.getTracks().forEach((track) => track.stop());
        context.close();
      },
    };
  }

  global.asrpool = { openStream, recordMicrophone, SAMPLE_RATE, FRAME_SIZE };
})(window);
