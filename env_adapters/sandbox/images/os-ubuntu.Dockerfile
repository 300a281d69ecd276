# The `ubuntu` flavour: a bare system with a file `file.txt` holding "tmp" in the working directory.
ARG BASE
FROM ${BASE}
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root \
    LANG=C.UTF-8 \
    TERM=dumb
RUN echo tmp > /file.txt
CMD ["bash"]
