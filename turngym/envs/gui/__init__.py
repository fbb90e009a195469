"""``gui-miniwob``: MiniWoB++ tasks in a real Chromium, through screenshots and mouse/keyboard tools."""
