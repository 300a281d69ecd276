# The `default` flavour of the OS-interaction task, on top of the imported Debian rootfs.
ARG BASE
FROM ${BASE}
# `docker import` leaves the image without any configuration: give every exec a sane environment.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root \
    LANG=C.UTF-8 \
    TERM=dumb
CMD ["bash"]
