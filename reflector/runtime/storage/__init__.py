"""Where bytes live: the content-addressed blob store (traces, archives, exports, journals), Temporal's
external payload storage on top of it, and the payload converter shared by client and workers."""
