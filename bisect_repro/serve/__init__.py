"""Serve: the replaying process's side of a replay. The channel to the controller (``channel``),
the requests (``requests``), the replies (``protocol``) and their one decoder at the controller's
edge (``replies``), the server a Recorder becomes there (``server``, and ``hooks`` for a
framework's loop), a step run under a request (``instrument``) and a step's kept start
(``start``)."""
