// A window-like pair for unit tests in Node: the app's frame and the hub above it. postMessage
// delivers a real `message` Event (with data, origin, source) on the receiving window, as a
// browser does, so the SDK's origin and source checks run unchanged.

export class FakeWindow extends EventTarget {
  constructor(href, { parent = null, ancestorOrigins = [] } = {}) {
    super();
    this.location = new URL(href);
    this.location.ancestorOrigins = ancestorOrigins;
    this.parent = parent || this;
    this.document = { currentScript: null };
    this.posted = [];
    const self = this;
    this.history = { state: null, replaceState(state, _title, url) { self.location.href = url; } };
  }

  /** What a browser does for `this.postMessage(data, targetOrigin)` called from `sender`. */
  deliver(data, sender) {
    const event = new Event("message");
    Object.assign(event, { data, origin: sender.location.origin, source: sender });
    this.dispatchEvent(event);
  }
}

/** A hub window at `hubOrigin` framing an app page at `appHref`; `answer(message)` plays the hub. */
export function framedApp(appHref, hubOrigin, answer) {
  const hub = new FakeWindow(hubOrigin + "/sandbox/hub");
  const app = new FakeWindow(appHref, { parent: hub, ancestorOrigins: [hubOrigin] });
  hub.postMessage = (data, targetOrigin) => {
    hub.posted.push({ data, targetOrigin });
    if (targetOrigin !== hubOrigin) return; // a browser drops a message for another origin
    const reply = answer(data);
    if (reply) setTimeout(() => app.deliver({ channel: "svc-platform", id: data.id, ...reply }, hub), 0);
  };
  return { hub, app };
}
