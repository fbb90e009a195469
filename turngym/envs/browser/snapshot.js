// Pruned DOM snapshot of a MiniWoB++ page: a flat, depth-annotated list of the visible
// elements that matter to an agent. Every listed element carries a stable id
// (data-tg-id), assigned once per page and kept while the element lives.
// Returns {nodes: [...], focused: id|null}. ``visiblePoint(el)`` is page.py's VISIBLE_POINT_JS.
(opts, visiblePoint) => {
  const SKIP_IDS = new Set(["reward-display", "click-canvas", "sync-task-cover", "query"]);
  const SKIP_TAGS = new Set(["SCRIPT", "STYLE", "HEAD", "META", "LINK", "NOSCRIPT", "TEMPLATE", "BR"]);
  const SHAPES = new Set(["circle", "rect", "ellipse", "polygon", "polyline", "path", "line", "text"]);
  const maxText = opts.maxText || 300;
  if (window.__tgNext === undefined) window.__tgNext = 1;

  const clean = (s) => (s || "").replace(/\s+/g, " ").trim();
  const cut = (s) => (s.length > maxText ? s.slice(0, maxText - 1) + "…" : s);

  function role(el) {
    const explicit = el.getAttribute("role");
    if (explicit) return explicit;
    const tag = el.tagName.toLowerCase();
    if (el instanceof SVGElement) return tag === "svg" ? "svg" : tag;
    switch (tag) {
      case "a": return el.hasAttribute("href") ? "link" : "a";
      case "button": return "button";
      case "select": return el.multiple ? "listbox" : "combobox";
      case "option": return "option";
      case "textarea": return "textbox";
      case "img": return "img";
      case "ul": case "ol": return "list";
      case "li": return "listitem";
      case "table": return "table";
      case "tr": return "row";
      case "td": return "cell";
      case "th": return "columnheader";
      case "label": return "label";
      case "p": return "paragraph";
      case "h1": case "h2": case "h3": case "h4": case "h5": case "h6": return "heading";
      case "input": {
        const t = (el.getAttribute("type") || "text").toLowerCase();
        if (t === "checkbox" || t === "radio") return t;
        if (t === "button" || t === "submit" || t === "reset" || t === "image") return "button";
        if (t === "range") return "slider";
        if (t === "hidden") return null;
        return "textbox";
      }
      default: return tag;
    }
  }

  const INTERACTIVE = new Set(["link", "button", "combobox", "listbox", "option", "textbox", "checkbox",
                               "radio", "slider", "spinbutton", "tab", "menuitem", "treeitem", "img"]);

  function labelOf(el) {
    if (el.id) {
      const lab = document.querySelector(`label[for="${CSS.escape(el.id)}"]`);
      if (lab) return clean(lab.textContent);
    }
    const parentLabel = el.closest("label");
    if (parentLabel) return clean(parentLabel.textContent);
    return "";
  }

  function directText(el) {
    let t = "";
    for (const c of el.childNodes) if (c.nodeType === 3) t += " " + c.data;
    return clean(t);
  }

  function nameOf(el, r) {
    const aria = el.getAttribute("aria-label");
    if (aria) return clean(aria);
    const tag = el.tagName.toLowerCase();
    if (tag === "input") {
      if (r === "button") return clean(el.value);
      return labelOf(el) || clean(el.getAttribute("placeholder")) || clean(el.getAttribute("title"));
    }
    if (tag === "textarea" || tag === "select") return labelOf(el) || clean(el.getAttribute("placeholder"));
    if (tag === "img") return clean(el.getAttribute("alt")) || clean(el.getAttribute("title"));
    if (tag === "text" || tag === "option" || tag === "button" || tag === "a" || tag === "label") {
      return clean(el.textContent);
    }
    return clean(el.getAttribute("title")) || "";
  }

  function visibleBox(el) {
    const r = el.getBoundingClientRect();
    return [r.left, r.top, r.width, r.height];
  }

  const nodes = [];
  let focusedId = null;

  function idOf(el) {
    if (!el.dataset) return null;
    if (!el.dataset.tgId) el.dataset.tgId = String(window.__tgNext++);
    return +el.dataset.tgId;
  }

  function walk(el, depth, parentBg, inSelect) {
    if (SKIP_TAGS.has(el.tagName) || SKIP_IDS.has(el.id)) return;
    if (el.classList && el.classList.contains("ui-resizable-handle")) return;
    const style = window.getComputedStyle(el);
    if (style.display === "none") return;
    const r = role(el);
    if (r === null) return;
    const box = inSelect ? inSelect : visibleBox(el);
    const shown = inSelect ? true : style.visibility !== "hidden" && style.opacity !== "0" && box[2] > 0 && box[3] > 0;
    const tag = el.tagName.toLowerCase();
    const isSvgShape = el instanceof SVGElement && SHAPES.has(tag);
    const bg = style.backgroundColor;
    const opaque = bg && bg !== "rgba(0, 0, 0, 0)" && bg !== "transparent";
    const ownBg = opaque && (bg !== parentBg || (!el.children.length && !clean(el.textContent))) ? bg : null;
    let name = cut(nameOf(el, r));
    const hasElementKids = Array.from(el.children).some((c) => !SKIP_TAGS.has(c.tagName));
    const text = cut(directText(el));
    if (!name && text && (!hasElementKids || INTERACTIVE.has(r))) name = text;
    if (!name && !hasElementKids && tag !== "input") name = cut(clean(el.textContent));
    const interactive = INTERACTIVE.has(r) || el.hasAttribute("onclick") || el.hasAttribute("tabindex");
    const keep = shown && (interactive || name || el.id || isSvgShape || (ownBg && !hasElementKids) ||
                           tag === "svg" || tag === "canvas" || (el.className && !hasElementKids));
    let childDepth = depth;
    if (keep) {
      const node = {id: idOf(el), depth, role: r, tag, name, box};
      if (el.id) node.domId = el.id;
      if (typeof el.className === "string" && el.className) {
        // jQuery UI's styling classes are noise, except the one that marks the active tab/item
        const cls = el.className.split(/\s+/).filter((c) => c && (!c.startsWith("ui-") || c === "ui-state-active"));
        if (cls.length) node.cls = cut(cls.join(" "));
      }
      if (tag === "input") {
        const t = (el.getAttribute("type") || "text").toLowerCase();
        if (!["text", "checkbox", "radio", "button", "submit", "reset"].includes(t)) node.type = t;
      }
      if (tag === "input" || tag === "textarea" || tag === "select") {
        if (el.type === "checkbox" || el.type === "radio") node.checked = el.checked;
        else node.value = String(el.value).slice(0, 2000);
        if (el.disabled) node.disabled = true;
      }
      if (tag === "option") node.selected = el.selected;
      if (ownBg) node.bg = ownBg;
      if (interactive || isSvgShape || el.id || ownBg) {
        const pt = visiblePoint(el);  // where a click lands on this element (null: covered)
        if (pt) node.pt = pt; else node.covered = true;
      }
      if (isSvgShape) {
        const fill = el.getAttribute("fill") || style.fill;
        if (fill && fill !== "none") node.fill = fill;
      }
      if (document.activeElement === el && el !== document.body) {
        node.focused = true;
        focusedId = node.id;
      }
      nodes.push(node);
      childDepth = depth + 1;
      if (text && name !== text && hasElementKids) {
        nodes.push({id: null, depth: childDepth, role: "text", tag: "#text", name: text, box});
      }
    } else if (shown && text && hasElementKids) {
      nodes.push({id: null, depth, role: "text", tag: "#text", name: text, box});
    }
    const selectBox = tag === "select" ? box : inSelect;
    for (const child of el.children) walk(child, childDepth, ownBg || parentBg, shown ? selectBox : null);
  }

  walk(document.body, 0, window.getComputedStyle(document.body).backgroundColor, null);
  return {nodes, focused: focusedId};
}
