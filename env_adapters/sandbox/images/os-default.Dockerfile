# The `default` flavour of the OS-interaction task, on top of the imported Debian rootfs.
ARG BASE
FROM ${BASE}
# `docker import` leaves the image without any configuration: give every exec a sane environment.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root \
    LANG=C.UTF-8 \
    TERM=dumb
# debootstrap leaves apt caches and lists behind; they only make every container heavier.
RUN rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/*
CMD ["bash"]
