"""``pidesk acp``: pidesk in an editor, over the Agent Client Protocol (agentclientprotocol.com).

``agent`` serves an editor's requests over a link to the host (the same link ``pidesk chat``
uses), ``translate`` says what each host record and event looks like in ACP, and ``stdio``
runs it on the process's standard input and output. The host stays the one authority: the
editor's answers go to it exactly as the web page's do.
"""
