"""Widgets more than one screen uses: theme, icons, pickers, the sampling panel, banners."""
