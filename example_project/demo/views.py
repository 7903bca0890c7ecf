from django.shortcuts import render

from django_jobq.queue import get_queue


def home(request):
    queues = []
    for name in ("thumbnails", "emails"):
        counts = get_queue(name).counts()
        queues.append({"name": name, "counts": {state.label: n for state, n in counts.items()}})
    return render(request, "home.html", {"queues": queues})
