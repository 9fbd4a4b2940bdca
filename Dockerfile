# The course in a container: JupyterLab over the lessons and exercises, torch's CPU build, a non-root user.
#
#   docker build -t zerokit-course .
#   docker run --rm -p 8888:8888 --shm-size=1g zerokit-course      # then open the URL it prints
#
# --shm-size: gloo's ranks on one machine share memory through /dev/shm (Docker's default 64 MiB is small for
# 4-8 ranks). The lessons run 2-8 processes: give the container 2 CPUs or more and 4 GiB of memory.
FROM python:3.11-slim

RUN useradd --create-home --uid 1000 learner
WORKDIR /home/learner/zerokit
COPY --chown=learner:learner . .
USER learner

# The learner's install: torch's CPU build and the course's needs only (the same script `make course` runs)
RUN tools/install.sh --venv /home/learner/venv --extras notebooks
ENV PATH=/home/learner/venv/bin:$PATH PYTHON=/home/learner/venv/bin/python

EXPOSE 8888
# tools/lab.sh serves on 127.0.0.1 (make lab); in a container it must listen on every interface to be reached
CMD ["tools/lab.sh", "--ip=0.0.0.0", "--port=8888", "--no-browser"]
