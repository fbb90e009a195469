"""``web-miniwob``: MiniWoB++ tasks in a real Chromium, through the DOM."""
