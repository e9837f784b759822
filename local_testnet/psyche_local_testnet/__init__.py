"""Local testnet: one server and N clients in tmux, with optional random kills."""
