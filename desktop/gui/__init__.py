"""The app's glue between widgets and engine: the app, the chat and Compare controllers, the model
slot and its worker thread, background tasks."""
