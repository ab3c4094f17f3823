// devchat page: renders the chat from a snapshot plus events, resumes from its cursor after a reconnect,
// and resends posts the server has not acknowledged (the server keeps one message per client_id).
'use strict';

(() => {
  const NAME_KEY = 'devchat.name';
  const CHANNEL_KEY = 'devchat.channel';
  const PENDING_KEY = 'devchat.pending';
  const MAX_BACKOFF_MS = 2000;
  const WINDOW = 200; // top-level messages of a channel kept in the DOM; older ones on request

  const $ = (id) => document.getElementById(id);

  // The name and channel are remembered per browser (localStorage); posts not yet acknowledged per tab
  // (sessionStorage survives a reload of the tab, and two tabs never resend each other's posts).
  const storage = (key) => (key === PENDING_KEY ? sessionStorage : localStorage);
  const saved = {
    get(key, fallback) {
      try {
        const raw = storage(key).getItem(key);
        return raw === null ? fallback : JSON.parse(raw);
      } catch (_) {
        return fallback;
      }
    },
    set(key, value) {
      try {
        storage(key).setItem(key, JSON.stringify(value));
      } catch (_) {
        // storage full or disabled: the page still works, it just forgets across reloads
      }
    },
  };

  const state = {
    epoch: null,
    cursor: null,
    bot: 'bot',
    answer: { default: 'mentions', channels: {} }, // which messages the bot answers, per channel
    channels: [],
    messages: new Map(), // id -> message
    byClient: new Map(), // client_id -> message id (posts the server has stored)
    pending: new Map(saved.get(PENDING_KEY, []).map((p) => [p.client_id, p])),
    channel: saved.get(CHANNEL_KEY, 'general'),
    thread: null,
    name: saved.get(NAME_KEY, ''),
    ws: null,
    live: false,
    backoff: 250,
    panel: { tasks: [], approvals: [], scheduling: '' },
    gateNotices: new Map(), // gate id -> {level, text}: answers to this page's own clicks
    renderQueued: false,
    stickToBottom: true,
    shown: WINDOW, // newest top-level messages of the channel kept in the DOM
  };

  // --- small helpers ---------------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = value;
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else if (key.startsWith('data')) node.setAttribute(key.replace(/[A-Z]/g, (c) => '-' + c.toLowerCase()), value);
      else node.setAttribute(key, value === true ? '' : value);
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child);
    }
    return node;
  }

  function put(node, ...children) {
    node.replaceChildren(...children.filter((c) => c !== null && c !== undefined && c !== false));
  }

  function clock(ms) {
    if (!ms) return '';
    return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  }

  function newClientId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  }

  function savePending() {
    saved.set(PENDING_KEY, Array.from(state.pending.values()));
  }

  function toast(text, level) {
    const note = el('p', { class: `notice ${level || 'info'}`, dataTestid: 'notice', role: 'status', text });
    $('notices').append(note);
    setTimeout(() => note.remove(), 6000);
  }

  function setStatus(kind, text) {
    const status = $('status');
    status.dataset.state = kind;
    status.textContent = text;
  }

  // --- navigation: #/<channel> or #/<channel>/<thread message id> -------------------------------------------

  function readHash() {
    const parts = location.hash.replace(/^#\/?/, '').split('/').filter(Boolean);
    if (parts.length > 0) state.channel = decodeURIComponent(parts[0]);
    state.thread = parts.length > 1 && /^\d+$/.test(parts[1]) ? Number(parts[1]) : null;
  }

  function go(channel, thread) {
    const hash = `#/${encodeURIComponent(channel)}${thread ? '/' + thread : ''}`;
    if (location.hash !== hash) history.replaceState(null, '', hash);
    if (state.channel !== channel) state.shown = WINDOW;
    state.channel = channel;
    state.thread = thread || null;
    saved.set(CHANNEL_KEY, channel);
    state.stickToBottom = true;
    render();
  }

  // --- connection -------------------------------------------------------------------------------------------

  function send(payload) {
    if (state.ws && state.ws.readyState === WebSocket.OPEN) {
      state.ws.send(JSON.stringify(payload));
      return true;
    }
    return false;
  }

  function connect() {
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    const ws = new WebSocket(`${scheme}://${location.host}/ws`);
    state.ws = ws;
    ws.addEventListener('open', () => {
      ws.send(JSON.stringify({ type: 'hello', cursor: state.cursor, epoch: state.epoch }));
    });
    ws.addEventListener('message', (event) => {
      if (state.ws === ws) receive(JSON.parse(event.data));
    });
    ws.addEventListener('close', () => {
      if (state.ws !== ws) return;
      state.ws = null;
      state.live = false;
      // What the panel shows is the last snapshot: while the bot is away it may say "running" for work that
      // is not running. Mark it stale until the next snapshot arrives.
      state.panelStale = true;
      setStatus('reconnecting', 'bot unreachable, reconnecting…');
      drawPanel();
      setTimeout(connect, state.backoff);
      state.backoff = Math.min(state.backoff * 2, MAX_BACKOFF_MS);
    });
  }

  function online() {
    state.live = true;
    state.backoff = 250;
    setStatus('connected', state.name ? `connected as ${state.name}` : 'connected (choose a name to post)');
    for (const post of state.pending.values()) sendPost(post);
  }

  function receive(msg) {
    switch (msg.type) {
      case 'snapshot':
        state.epoch = msg.epoch;
        state.cursor = msg.cursor;
        state.bot = msg.bot || state.bot;
        state.answer = msg.answer || state.answer;
        state.channels = msg.channels;
        state.messages = new Map();
        state.byClient = new Map();
        for (const message of msg.messages) remember(message);
        online();
        break;
      case 'events':
        for (const event of msg.events) {
          if (state.cursor !== null && event.seq <= state.cursor) continue; // seen before a reconnect
          if (!msg.resumed && state.cursor !== null && event.seq > state.cursor + 1) {
            // Sequence numbers have no holes: a live event skipped one. Reconnect and resume from the cursor.
            if (state.ws) state.ws.close();
            return;
          }
          apply(event);
          state.cursor = event.seq;
        }
        if (msg.resumed) {
          if (state.cursor === null || msg.cursor > state.cursor) state.cursor = msg.cursor;
          online();
        }
        break;
      case 'ack':
        state.pending.delete(msg.client_id);
        savePending();
        break;
      case 'nack':
        // Stored but not handed to the bot yet: try again shortly (same client_id, so never twice).
        setTimeout(() => {
          const post = state.pending.get(msg.client_id);
          if (post) sendPost(post);
        }, 2000);
        break;
      case 'notice':
        // A decision time comes as a timestamp: shown in the reader's own clock, like every time on the page.
        if (msg.decided_at) msg.text = `${msg.text} at ${clock(msg.decided_at)}`;
        if (msg.gate !== undefined && msg.gate !== null) {
          // Shown on the card while the request stays as it was when this page clicked.
          const card = Array.from(state.messages.values()).find((m) => m.gate && m.gate.gate_id === msg.gate);
          state.gateNotices.set(msg.gate, { ...msg, status: card ? card.gate.status : null });
        }
        toast(msg.text, msg.level);
        break;
      case 'panel':
        state.panel = msg;
        state.panelStale = false;  // a fresh snapshot from the bot
        break;
      case 'error':
        toast(msg.text, 'error');
        break;
      default:
        break;
    }
    render();
  }

  function remember(message) {
    state.messages.set(message.id, message);
    if (message.client_id) state.byClient.set(message.client_id, message.id);
  }

  function apply(event) {
    if (event.type === 'message') {
      remember(event.message);
    } else if (event.type === 'deleted') {
      state.messages.delete(event.id);
    } else if (event.type === 'channel') {
      if (!state.channels.some((c) => c.name === event.channel.name)) state.channels.push(event.channel);
    }
  }

  // --- actions ----------------------------------------------------------------------------------------------

  function requireName() {
    if (state.name) return true;
    toast('Choose a display name first.', 'error');
    $('name-input').focus();
    return false;
  }

  function sendPost(post) {
    send({
      type: 'post',
      name: post.name,
      channel: post.channel,
      thread: post.thread,
      text: post.text,
      client_id: post.client_id,
    });
  }

  function post(channel, thread, text) {
    const item = { client_id: newClientId(), name: state.name, channel, thread, text, at: Date.now() };
    state.pending.set(item.client_id, item);
    savePending();
    sendPost(item);
    state.stickToBottom = true;
    render();
  }

  function click(gate, action) {
    if (!requireName()) return;
    state.gateNotices.delete(gate);
    if (!send({ type: 'click', name: state.name, gate, action })) toast('Not connected; try again.', 'error');
    render();
  }

  function retry(task) {
    if (!requireName()) return;
    if (!send({ type: 'retry', name: state.name, task })) toast('Not connected; try again.', 'error');
  }

  function bindComposer(formId, inputId, target) {
    const form = $(formId);
    const input = $(inputId);
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      const text = input.value.trim();
      if (!text || !requireName()) return;
      const where = target();
      if (!where) return;
      post(where.channel, where.thread, text);
      input.value = '';
    });
    input.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
  }

  // --- rendering --------------------------------------------------------------------------------------------

  // One draw per animation frame at most: a streamed answer changes many times a second, and each draw only
  // touches the window of messages on screen (see WINDOW), so a long channel streams as smoothly as a new one.
  function render() {
    if (state.renderQueued) return;
    state.renderQueued = true;
    const run = () => {
      state.renderQueued = false;
      draw();
    };
    if (document.hidden) queueMicrotask(run);
    else requestAnimationFrame(run);
  }

  // Keep one DOM node per key, in order; rebuild a node's content only when its signature changed.
  function reconcile(container, items) {
    const existing = new Map();
    for (const node of Array.from(container.children)) existing.set(node.dataset.key, node);
    let previous = null;
    for (const item of items) {
      let node = existing.get(item.key);
      if (node) existing.delete(item.key);
      else {
        node = document.createElement(item.tag || 'li');
        node.dataset.key = item.key;
      }
      if (node._signature !== item.signature) {
        node._signature = item.signature;
        item.fill(node);
      }
      const expected = previous ? previous.nextSibling : container.firstChild;
      if (node !== expected) container.insertBefore(node, expected);
      previous = node;
    }
    for (const node of existing.values()) node.remove();
  }

  function replyCounts() {
    const counts = new Map();
    for (const message of state.messages.values()) {
      if (message.thread !== null) counts.set(message.thread, (counts.get(message.thread) || 0) + 1);
    }
    return counts;
  }

  function pendingIn(channel, thread) {
    return Array.from(state.pending.values()).filter(
      (p) => p.channel === channel && (p.thread || null) === thread && !state.byClient.has(p.client_id),
    );
  }

  function earlierItem(hidden) {
    return {
      key: 'earlier',
      signature: String(hidden),
      fill: (node) => {
        node.className = 'earlier';
        put(
          node,
          el('button', {
            type: 'button',
            dataTestid: 'show-earlier',
            onclick: () => {
              state.shown += WINDOW;
              render();
            },
            text: `Show earlier messages (${hidden} more)`,
          }),
        );
      },
    };
  }

  function messageItem(message, replies, options) {
    let notice = message.gate ? state.gateNotices.get(message.gate.gate_id) || null : null;
    if (notice && notice.status !== null && notice.status !== message.gate.status) notice = null;
    const signature = JSON.stringify([message.text, message.final, message.gate, replies, notice, options.top]);
    return { key: `m${message.id}`, signature, fill: (node) => fillMessage(node, message, replies, notice, options) };
  }

  function fillMessage(node, message, replies, notice, options) {
    node.className = `msg ${message.kind}${message.final ? '' : ' streaming'}${message.author === state.name ? ' mine' : ''}`;
    node.dataset.testid = 'message';
    node.dataset.id = String(message.id);
    node.dataset.kind = message.kind;
    node.dataset.author = message.author;
    node.dataset.final = String(Boolean(message.final));
    if (message.final) node.removeAttribute('aria-busy');
    else node.setAttribute('aria-busy', 'true');
    const meta = el(
      'p',
      { class: 'meta' },
      el('span', { class: 'author', dataTestid: 'author', text: message.author }),
      message.kind === 'human' ? null : el('span', { class: 'badge', text: 'bot' }),
      el('time', { dateTime: new Date(message.created_at).toISOString(), text: clock(message.created_at) }),
      null,  // a bot answer is edited as it streams: that is not an edit a reader needs to be told about
    );
    const body =
      message.kind === 'approval' && message.gate
        ? approvalCard(message.gate, notice)
        : el('div', { class: 'text', dataTestid: 'text', text: message.text });
    const actions = [];
    if (options.top) {
      const label = replies ? `${replies} ${replies === 1 ? 'reply' : 'replies'}` : 'Reply in thread';
      actions.push(
        el('button', {
          type: 'button',
          class: 'link',
          dataTestid: 'open-thread',
          'aria-label': `${label} (message from ${message.author})`,
          onclick: () => go(message.channel, message.id),
          text: label,
        }),
      );
    }
    put(node, meta, body, actions.length ? el('div', { class: 'actions' }, ...actions) : null);
  }

  function approvalCard(gate, notice) {
    const statusText = {
      pending: 'Waiting for an approver',
      approved: `Approved by ${gate.decided_by} at ${clock(gate.decided_at)}`,
      denied: `Denied by ${gate.decided_by} at ${clock(gate.decided_at)}`,
      withdrawn: `Withdrawn by ${gate.decided_by} at ${clock(gate.decided_at)} (not run)`,
      expired: `Expired at ${clock(gate.decided_at || gate.expires_at)} (not approved in time)`,
    }[gate.status] || gate.status;
    const approvers = [...(gate.approvers || []), ...(gate.groups || []).map((g) => `group ${g}`)];
    const pending = gate.status === 'pending';
    const card = el(
      'div',
      { class: `card ${gate.status}`, dataTestid: 'approval', dataStatus: gate.status, dataGate: String(gate.gate_id) },
      el('p', { class: 'card-title' }, `Approval #${gate.gate_id} needed: `, el('strong', { text: gate.tool })),
      el('pre', { class: 'args', dataTestid: 'approval-args', text: JSON.stringify(gate.arguments, null, 2) }),
      el('p', {
        class: 'muted',
        dataTestid: 'approval-who',
        text: `${gate.requester_name ? `asked by ${gate.requester_name} · ` : ''}may approve: ${approvers.join(', ') || 'nobody'} · expires ${clock(gate.expires_at)}`,
      }),
      el('p', { class: 'card-status', dataTestid: 'approval-status', text: statusText }),
    );
    // A decided card keeps its buttons, disabled and labelled by the status above, so it reads the same as
    // before; a page that still shows them enabled gets "already approved by ..." privately on a click.
    const button = (action, label, cls) =>
      el('button', {
        type: 'button',
        class: cls,
        dataTestid: action,
        disabled: !pending,
        'aria-disabled': String(!pending),
        title: pending ? '' : statusText,
        onclick: () => click(gate.gate_id, action),
        text: label,
      });
    card.append(
      el(
        'div',
        { class: 'buttons', role: 'group', 'aria-label': pending ? `Decide ${gate.tool}` : statusText },
        button('approve', 'Approve', 'approve'),
        button('deny', 'Deny', 'deny'),
        button('withdraw', 'Withdraw', 'withdraw'),
      ),
    );
    if (notice) {
      card.append(el('p', { class: `card-notice ${notice.level}`, dataTestid: 'approval-notice', role: 'alert', text: notice.text }));
    }
    return card;
  }

  function pendingItem(item) {
    return {
      key: `p${item.client_id}`,
      signature: item.text,
      fill: (node) => {
        node.className = 'msg human mine pending';
        node.dataset.testid = 'message';
        node.dataset.kind = 'human';
        node.dataset.pending = 'true';
        node.dataset.author = item.name;
        put(
          node,
          el('p', { class: 'meta' }, el('span', { class: 'author', text: item.name }), el('span', { class: 'muted', text: 'sending…' })),
          el('div', { class: 'text', dataTestid: 'text', text: item.text }),
        );
      },
    };
  }

  function nearBottom(list) {
    return list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  }

  function drawList(list, items) {
    const stick = state.stickToBottom || nearBottom(list);
    reconcile(list, items);
    if (stick) list.scrollTop = list.scrollHeight;
  }

  function draw() {
    const counts = replyCounts();
    // channels
    const channels = state.channels.some((c) => c.name === state.channel)
      ? state.channels
      : state.channels.concat([{ name: state.channel }]);
    reconcile(
      $('channel-list'),
      channels.map((c) => ({
        key: c.name,
        signature: String(c.name === state.channel),
        fill: (node) =>
          put(
          node,
            el('button', {
              type: 'button',
              class: 'channel',
              dataTestid: `channel-${c.name}`,
              'aria-current': c.name === state.channel ? 'page' : null,
              onclick: () => go(c.name, null),
              text: `# ${c.name}`,
            }),
          ),
      })),
    );
    $('channel-title').textContent = `#${state.channel}`;
    const mode = state.answer.channels[state.channel] || state.answer.default;
    const hint = {
      all: `${state.bot} answers every message`,
      mentions: `mention @${state.bot} to ask the bot`,
      none: `${state.bot} does not answer here`,
    }[mode] || '';
    $('composer-input').placeholder = `Message #${state.channel}${hint ? ` — ${hint}` : ''}`;

    // the channel: only the newest `state.shown` messages are in the DOM; older ones on request
    const messages = Array.from(state.messages.values()).sort((a, b) => a.id - b.id);
    const top = messages.filter((m) => m.channel === state.channel && m.thread === null);
    const hidden = Math.max(0, top.length - state.shown);
    drawList(
      $('messages'),
      (hidden ? [earlierItem(hidden)] : [])
        .concat(top.slice(hidden).map((m) => messageItem(m, counts.get(m.id) || 0, { top: true })))
        .concat(pendingIn(state.channel, null).map(pendingItem)),
    );

    // the open thread
    const pane = $('thread');
    const parent = state.thread === null ? undefined : state.messages.get(state.thread);
    if (state.thread !== null && parent && parent.channel === state.channel) {
      pane.hidden = false;
      const parentList = $('thread-parent');
      reconcile(parentList, [{ ...messageItem(parent, 0, { top: false }), tag: 'div' }]);
      const replies = messages.filter((m) => m.thread === state.thread);
      drawList(
        $('thread-messages'),
        replies.map((m) => messageItem(m, 0, { top: false })).concat(pendingIn(state.channel, state.thread).map(pendingItem)),
      );
    } else {
      pane.hidden = true;
    }
    state.stickToBottom = false;
    drawPanel();
  }

  function drawPanel() {
    const panel = state.panel;
    const aside = $('panel');
    aside.dataset.stale = state.panelStale ? 'true' : 'false';
    $('panel-stale').hidden = !state.panelStale;
    $('scheduling').textContent = panel.scheduling ? `(${panel.scheduling})` : '';
    const tasks = panel.tasks || [];
    reconcile(
      $('tasks'),
      (tasks.length ? tasks : [null]).map((task) => {
        if (task === null) {
          return { key: 'none', signature: 'none', fill: (node) => put(node, el('span', { class: 'muted', text: 'No live tasks' })) };
        }
        return {
          key: `t${task.id}`,
          signature: JSON.stringify(task),
          fill: (node) => {
            node.dataset.testid = 'task';
            node.dataset.state = task.state;
            node.className = `task ${task.state}`;
            put(
              node,
              el('span', { class: 'state', text: task.state }),
              ' ',
              el('span', { text: `#${task.id} ${task.label}` }),
              el('span', { class: 'muted', text: ` · ${task.place}${task.reason ? ` · ${task.reason}` : ''}` }),
              task.state === 'parked'
                ? el('button', { type: 'button', dataTestid: 'retry', onclick: () => retry(task.id), text: 'Retry' })
                : null,
            );
          },
        };
      }),
    );
    const approvals = panel.approvals || [];
    reconcile(
      $('approvals'),
      (approvals.length ? approvals : [null]).map((gate) => {
        if (gate === null) {
          return { key: 'none', signature: 'none', fill: (node) => put(node, el('span', { class: 'muted', text: 'No approval requests' })) };
        }
        return {
          key: `g${gate.gate}`,
          signature: JSON.stringify(gate),
          fill: (node) => {
            node.dataset.testid = 'approval-row';
            node.dataset.status = gate.status;
            node.className = `gate ${gate.status}`;
            const who = gate.decided_by ? ` by ${gate.decided_by}` : '';
            put(
          node,
              el('span', { class: 'state', text: gate.status }),
              ' ',
              el('span', { text: `${gate.tool} ${JSON.stringify(gate.arguments)}${who}` }),
              el('span', { class: 'muted', text: ` · ${gate.place || ''}${gate.requester ? ` · asked by ${gate.requester}` : ''}` }),
            );
          },
        };
      }),
    );
  }

  // --- start ------------------------------------------------------------------------------------------------

  function start() {
    readHash();
    $('name-input').value = state.name;
    $('name-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const name = $('name-input').value.replace(/\s+/g, ' ').trim();
      if (!name) return;
      state.name = name;
      saved.set(NAME_KEY, name);
      state.gateNotices.clear();  // a refusal was for the previous name; it no longer applies
      if (state.live) setStatus('connected', `connected as ${name}`);
      toast(`You are ${name}.`, 'info');
      render();
    });
    $('channel-form').addEventListener('submit', (event) => {
      event.preventDefault();
      const channel = $('channel-input').value.trim().replace(/^#/, '').toLowerCase();
      if (!channel || !requireName()) return;
      send({ type: 'channel', name: state.name, channel });
      $('channel-input').value = '';
      go(channel, null);
    });
    $('thread-close').addEventListener('click', () => go(state.channel, null));
    bindComposer('composer', 'composer-input', () => ({ channel: state.channel, thread: null }));
    bindComposer('thread-composer', 'thread-input', () =>
      state.thread === null ? null : { channel: state.channel, thread: state.thread },
    );
    window.addEventListener('hashchange', () => {
      readHash();
      state.stickToBottom = true;
      render();
    });
    render();
    connect();
  }

  start();
})();
