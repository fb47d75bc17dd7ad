"""inspection."""
