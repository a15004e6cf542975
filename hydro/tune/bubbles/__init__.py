"""Bubble Squeezer on Ray: the placement service, the Tune scheduler, the fill trainable and Ray Train jobs' stages
as bubble slots."""
