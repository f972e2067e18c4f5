"""What only rank 0 does: the socket, admission, scheduling and the routing of output to clients.

Importing this package loads no MLX; of its modules, scheduler, validate, errors and piece never
do, so unit tests drive them directly.
"""
