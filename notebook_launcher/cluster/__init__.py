"""Several hosts: the kernel's side of each agent, the back channel, host names and commands, the signed frames
between kernel and agents, the c10d rendezvous between nodes and the port rank 0 serves on."""
