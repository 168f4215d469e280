"""Qt widgets of the Nanoscope window (one widget per module). Only the GUI thread uses them."""
